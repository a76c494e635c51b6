#!/usr/bin/env bash
# The bench on the path a user gets with no flags (compile="auto": on this AMX host the target eager, one kernel
# call per layer; the draft compiled by the first use's worker beforehand): the 60 prompts of
# ../engine-bench/prompts.jsonl (20 MT-Bench, 40 Spec-Bench dev), 128 tokens, T = 0 and 1, `ar` and the default
# against every peer (transformers' generate, its prompt lookup and its assisted generation with the default
# draft; llama.cpp through llama-cpp-python, built with docs/benchmarks.md's flags), in one process.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts ../engine-bench/prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid \
  --method hf --method hf-lookup --method hf-assisted --method llama-cpp \
  --temperature 0 --temperature 1 --max-new-tokens 128 --out bench "$@"
python ../../engine_goals.py bench/results.jsonl > goals.md
