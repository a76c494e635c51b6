#!/usr/bin/env bash
# Issue 29's bench on the engine as of session 39: the 60 prompts (session 26's file: 8 per Spec-Bench dev
# category and 20 MT-Bench), 128 tokens, T = 0, compiled forwards for ours, the peers in the same dtype.
# Only the methods the speed goals compare (ar, the default, sd gamma 1) and every peer, to fit one session.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 \
  --method hf --method hf-assisted --method hf-lookup --method hf-static --method llama-cpp \
  --temperature 0 --max-new-tokens 128 --compile --out bench "$@"
