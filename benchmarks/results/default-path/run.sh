#!/usr/bin/env bash
# The bench on the path a user gets with no flags (compile="auto": on this AMX host the target eager, one kernel
# call per layer; the draft compiled by the first use's worker beforehand), 20 of the 60 prompts
# (../engine-bench/prompts.jsonl, each category), 128 tokens, T = 0 and 1, the default and `ar` against
# transformers' generate, in one process.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts ../engine-bench/prompts.jsonl --limit 20 --spread \
  --method ar --method sd:gamma=auto,drafter=hybrid --method hf \
  --temperature 0 --temperature 1 --max-new-tokens 128 --out bench "$@"
python ../../engine_goals.py bench/results.jsonl > goals.md
