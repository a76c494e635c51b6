#!/bin/sh
# Issue 31's 10 + 10 protocol, two of its combos (time), on the engine after the kernel-variant choice and the
# guard change (session 29, 98c5bdb): mt-bench and translation at T = 0, one process.
cd "$(dirname "$0")/../../.." || exit 1
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-kernels-s29-cpu-2core --per-half 10 \
    --temperatures 0 --compile --only mt-bench-T0 translation-T0 "$@"
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-kernels-s29-cpu-2core --summarise
