#!/bin/sh
# A smaller follow-up: cheaper dsbd settings against beam widths 2 and 3, same sampling, 10 prompts.
multispec bench --prompts mt-bench --prompts spec-bench-dev --spread --limit 5 \
  --temperature 1 --top-k 10 --top-p 0.8 --max-new-tokens 128 --baseline beam:width=3 \
  --method beam:width=2 --method beam:width=3 --method dsbd --method dsbd:width_threshold=0.9 \
  --method dsbd:gamma=2 --method dsbd:draft_width=2 --method dsbd:gamma=2,draft_width=2 \
  --out benchmarks/results/dsbd-s16-cpu-2core/sweep "$@"
