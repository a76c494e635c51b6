#!/usr/bin/env bash
# The same 60 prompts at T = 1 (session 47, 2026-11-27, host `vm`): the methods whose seeds' claims held at
# T = 1 in session 45 (mjsd, mtad against ar and sd), compiled bfloat16, transformers' generate in the same process.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 --method mjsd --method mtad --method hf \
  --temperature 1 --max-new-tokens 128 --compile --out bench-T1 "$@"
