#!/bin/sh
# Issue 21's bench: beam widths 1-4, sd, dsbd fixed / dynamic / one-cache; seed 003's sampling settings
# (temperature 1, top-k 10, top-p 0.8), 128 new tokens, 20 MT-Bench + 20 Spec-Bench dev prompts.
multispec bench --prompts mt-bench --prompts spec-bench-dev --spread --limit 20 \
  --temperature 1 --top-k 10 --top-p 0.8 --max-new-tokens 128 --baseline beam:width=3 \
  --method beam:width=1 --method beam:width=2 --method beam:width=3 --method beam:width=4 --method sd \
  --method dsbd --method dsbd:width_threshold=0 --method dsbd:one_cache=true \
  --out benchmarks/results/dsbd-s16-cpu-2core/bench "$@"
