#!/usr/bin/env bash
# Issue 29's goals against stock transformers, as a user gets them without --compile (eager, this host's
# default dtype): 24 Spec-Bench dev prompts (4 per category, spread), greedy, 128 new tokens, one process.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts spec-bench-dev --limit 24 --spread \
  --method ar --method sd:gamma=auto,drafter=hybrid --method hf --method hf-lookup \
  --temperature 0 --max-new-tokens 128 --out bench "$@"
