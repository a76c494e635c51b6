#!/bin/sh
# tokens/s of whole greedy generations, batch-invariant against fast compiled steps, alternating processes
# (session 44's script: six Spec-Bench dev prompts, 64 tokens, hf in every process)
for mode in invariant compiled invariant compiled; do
  python benchmarks/results/compiled-invariant-s44-cpu-2core/gen_speed.py $mode
done
