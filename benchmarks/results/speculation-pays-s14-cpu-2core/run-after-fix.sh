#!/bin/sh
# After the exploration fix (adaptive.EXPLORE): ar and the default only, the same 20 Spec-Bench prompts.
set -e
cd "$(dirname "$0")"
multispec bench --prompts spec-bench-dev --spread --limit 20 --method ar --method sd:gamma=auto,drafter=hybrid \
    --temperature 0 --temperature 1 --max-new-tokens 128 --out after-fix --resume
