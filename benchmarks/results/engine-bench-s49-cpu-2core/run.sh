#!/usr/bin/env bash
# Issue 29's bench with the `dpbf16` kernel variant (session 49, 2026-11-27, host `vm`): the 60 prompts of
# engine-bench-s48 (8 per Spec-Bench dev category, 20 MT-Bench), 128 tokens, T = 0, compiled bfloat16, one
# process, with transformers' peers in the same process: plain generate, its static cache with a compiled
# forward, its prompt lookup and its assisted decoding with our draft.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 --method mcsd:k_config=2x1 \
  --method mjsd --method mtad --method hf --method hf-static --method hf-lookup --method hf-assisted \
  --temperature 0 --max-new-tokens 128 --compile --out bench "$@"
