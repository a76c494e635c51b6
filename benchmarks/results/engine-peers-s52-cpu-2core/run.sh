#!/usr/bin/env bash
# Issue 29's peers in one run (2026-11-28, host `vm`): `ar` and the default against every peer the issue names,
# hf-static and llama-cpp included (session 51's bench left them out). Session 49's 60 prompts, 128 tokens, T = 0
# and 1, compiled bfloat16 for ours, transformers' peers in the dtype ours runs in, llama.cpp on the shipped GGUF
# file (llama-cpp-python built with the README's flags: GGML_NATIVE=OFF, AVX512 on, AMX off).
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid \
  --method hf --method hf-static --method hf-lookup --method hf-assisted --method llama-cpp \
  --temperature 0 --temperature 1 --max-new-tokens 128 --compile --out bench "$@"
python ../../engine_goals.py bench/results.jsonl > goals.md
