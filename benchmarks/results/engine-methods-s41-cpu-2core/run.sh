#!/usr/bin/env bash
# What engine-methods-s40 left out, on its 60 prompts (prompts.jsonl), 128 tokens, compiled bfloat16, each
# temperature in one process with its own ar and sd gamma 1 (ratios stay within a process):
# - T = 1: mcsd's default tree and specinfer (not run at T = 1 in s40), mjsd and mtad again after the by-row
#   beam picks and draws (beam-work-s41), the best mcsd of s40 (2x1);
# - T = 0: beam widths 2 and 3 again after the shared-prefix reorder (beam-shared-prefix-s40).
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=1 --method mcsd --method mcsd:k_config=2x1 --method specinfer \
  --method mjsd --method mtad --temperature 1 --max-new-tokens 128 --compile --out bench-T1 "$@"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=1 --method beam:width=2 --method beam:width=3 \
  --temperature 0 --max-new-tokens 128 --compile --out bench-T0 "$@"
