#!/usr/bin/env bash
# The same 60 prompts at T = 1 (top-k 0, top-p 1), 128 tokens, compiled bfloat16, one process: fewer methods than
# run.sh (the fastest of each family at T = 0, the beams, and transformers' generate and assisted generation).
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 --method mcsd:k_config=2x1 \
  --method mjsd --method mtad --method hf --method hf-assisted \
  --temperature 1 --max-new-tokens 128 --compile --out bench-T1 "$@"
