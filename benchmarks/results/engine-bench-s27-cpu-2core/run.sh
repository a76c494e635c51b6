#!/usr/bin/env bash
# Issue 29's bench, halved to fit one session: 20 prompts (3 per Spec-Bench dev category, 5 MT-Bench,
# the first of session 26's 60), 128 tokens, T = 0 then T = 1, compiled forwards for ours, every peer.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 --method sd:gamma=4 \
  --method mcsd:k_config=8x1 --method specinfer --method mjsd --method mtad \
  --method beam:width=2 --method beam:width=3 --method dsbd \
  --method hf --method hf-assisted --method hf-lookup --method hf-static --method llama-cpp \
  --temperature 0 --temperature 1 --max-new-tokens 128 --compile --out bench "$@"
