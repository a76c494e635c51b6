#!/usr/bin/env bash
# Issue 29's bench, the papers' methods: the 60 prompts of engine-bench-s39 (8 per Spec-Bench dev category, 20
# MT-Bench), 128 tokens, compiled bfloat16, one process, T = 0 (`T=1 ./run.sh` for T = 1). ar and sd gamma 1 run
# again here so that every ratio is within one process. Shapes on several rows (beams, dsbd, the joint drafts)
# compile on first use; that time is reported apart from decoding.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=1 --method sd:gamma=4 --method mcsd --method mcsd:k_config=2x1 \
  --method specinfer --method mjsd --method mtad --method beam:width=2 --method beam:width=3 --method dsbd \
  --temperature "${T:-0}" --max-new-tokens 128 --compile --out "bench${T:+-T$T}" "$@"
