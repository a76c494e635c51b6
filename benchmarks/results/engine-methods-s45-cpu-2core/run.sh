#!/usr/bin/env bash
# Issue 29's bench on today's host (2026-11-27, session 45; a faster CPU than sessions 39-44's, with a flatter
# compiled cost curve): the 60 prompts of engine-bench-s39 (8 per Spec-Bench dev category, 20 MT-Bench), 128
# tokens, T = 0, compiled bfloat16, one process, the papers' methods beside ar, sd, the default and transformers'
# own generate (plain and assisted) in the same process.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 --method sd:gamma=4 \
  --method mcsd --method mcsd:k_config=2x1 --method specinfer --method mjsd --method mtad \
  --method hf --method hf-assisted \
  --temperature 0 --max-new-tokens 128 --compile --out bench "$@"
