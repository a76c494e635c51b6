#!/bin/sh
# alternating processes: the default compiled step (batch-invariant here) and the fast one
for mode in default fast default fast; do
  python benchmarks/results/compiled-invariant-dpbf16-s50-cpu-2core/gen_speed.py $mode
done
