#!/usr/bin/env bash
# The same bench at T = 1 (session 49, 2026-11-27, host `vm`): the 60 prompts, 128 tokens, compiled bfloat16,
# with transformers' peers in the same process.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 --method mcsd:k_config=2x1 \
  --method mjsd --method mtad --method hf --method hf-static --method hf-lookup --method hf-assisted \
  --temperature 1 --max-new-tokens 128 --compile --out bench-T1 "$@"
