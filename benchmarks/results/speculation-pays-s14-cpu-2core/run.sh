#!/bin/sh
# The issue-22 bench (session 14): 20 Spec-Bench dev prompts (4 per category) and 10 MT-Bench prompts
# (spread), temperature 0 and 1, 128 new tokens, the embedded pair in float32, on the 2-core CPU.
set -e
cd "$(dirname "$0")"
M="--method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 --method sd:gamma=4
   --method sd:gamma=1,drafter=lookup --method sd:gamma=4,drafter=lookup
   --method sd:gamma=1,drafter=suffix --method sd:gamma=4,drafter=suffix
   --method sd:gamma=1,drafter=hybrid --method sd:gamma=4,drafter=hybrid
   --method sd:gamma=auto --method hf --method hf-assisted --method hf-lookup"
multispec bench --prompts ../../../../shared/data/spec_bench_dev.jsonl --spread --limit 20 $M \
    --temperature 0 --temperature 1 --max-new-tokens 128 --out spec-bench --resume
multispec bench --prompts ../../../../shared/data/mt_bench.jsonl --spread --limit 10 $M \
    --temperature 0 --temperature 1 --max-new-tokens 128 --out mt-bench --resume
