#!/usr/bin/env bash
# After the prefill change (9eee877) and the draws change (44c18e5): the long-prompt categories of run.sh's
# bench (summarization, rag: 6 prompts), ours against the peers, T = 0 and 1, compiled forwards.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts-long.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method hf --method hf-static --method hf-lookup \
  --method hf-assisted --method llama-cpp \
  --temperature 0 --temperature 1 --max-new-tokens 128 --compile --out bench-long "$@"
