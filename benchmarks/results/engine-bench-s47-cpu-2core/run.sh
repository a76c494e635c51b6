#!/usr/bin/env bash
# Issue 29's bench after the in-place cache writes (session 47, 2026-11-27, host `vm`): the 60 prompts of
# engine-methods-s45 (8 per Spec-Bench dev category, 20 MT-Bench), 128 tokens, T = 0, compiled bfloat16, one
# process, transformers' generate in the same process.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 --method mcsd:k_config=2x1 \
  --method mjsd --method mtad --method hf \
  --temperature 0 --max-new-tokens 128 --compile --out bench "$@"
