#!/usr/bin/env bash
# After the kernel-variant choice (a38ce1c): issue 29's 20-prompt file of session 27, 128 tokens, T = 0 then
# T = 1, ours compiled against stock transformers in the same process (hf, its prompt lookup, its assisted
# decoding). Fewer methods than session 27's run (time): ar, the default, sd gamma 1.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 \
  --method hf --method hf-lookup --method hf-assisted \
  --temperature 0 --temperature 1 --max-new-tokens 128 --compile --out bench "$@"
