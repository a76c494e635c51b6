#!/usr/bin/env bash
# Issue 29's bench after compiled steps became batch-invariant by default where our kernels run (session 50,
# 2026-11-27, host `vm`): session 49's 60 prompts and methods, 128 tokens, T = 0, compiled bfloat16, one process,
# transformers' peers in the same process.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 --method mcsd:k_config=2x1 \
  --method mjsd --method mtad --method hf --method hf-static --method hf-lookup --method hf-assisted \
  --temperature 0 --max-new-tokens 128 --compile --out bench "$@"
