#!/usr/bin/env bash
# The bench on the path a user gets with no flags (compile="auto": compiled steps, made by the first-use workers
# beforehand), 60 prompts (../engine-bench/prompts.jsonl: 20 MT-Bench, 40 Spec-Bench dev), 128 tokens, T = 0 and
# 1, the default and `ar` against transformers' generate, prompt lookup and assisted generation, in one process.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts ../engine-bench/prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method hf --method hf-lookup --method hf-assisted \
  --temperature 0 --temperature 1 --max-new-tokens 128 --out bench "$@"
python ../../engine_goals.py bench/results.jsonl > goals.md
