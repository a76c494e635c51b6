#!/usr/bin/env bash
# the measurements of this folder, in one go (about 25 minutes on a 2-core CPU)
set -euo pipefail
R=benchmarks/results/engine-s17-cpu-2core
python benchmarks/cost_curve.py --out $R/cost_curve.jsonl --engines static,dynamic --dtypes bfloat16,float32 \
  --models target,draft > $R/cost_curve.log 2>&1
multispec bench --prompts mt-bench --limit 5 --spread --prompts spec-bench-dev --limit 5 --spread \
  --method hf --method hf-static --method hf-lookup --method ar --method "sd:gamma=auto,drafter=hybrid" \
  --method sd:gamma=1 --temperature 0 --max-new-tokens 64 --compile --out $R/bench-t0 --force
multispec bench --prompts mt-bench --limit 5 --spread --prompts spec-bench-dev --limit 5 --spread \
  --method hf --method hf-static --method hf-lookup --method ar --method "sd:gamma=auto,drafter=hybrid" \
  --method sd:gamma=1 --temperature 1 --max-new-tokens 64 --compile --out $R/bench-t1 --force
python benchmarks/greedy_drift.py bfloat16 30 48 > $R/drift-bf16.json
python benchmarks/greedy_drift.py float32 30 48 > $R/drift-f32.json
