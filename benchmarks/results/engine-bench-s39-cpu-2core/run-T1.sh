#!/usr/bin/env bash
# run.sh at T = 1 (top-k 0, top-p 1): the same 60 prompts, methods and peers, a second process.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 \
  --method hf --method hf-assisted --method hf-lookup --method hf-static --method llama-cpp \
  --temperature 1 --max-new-tokens 128 --compile --out bench-T1 "$@"
