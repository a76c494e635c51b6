#!/bin/sh
# Issue 31's 10 + 10 protocol on the compiled engine as of session 38 (tree=auto's cheaper search; per-machine kernels per bucket, packed
# eager linears, fused prompt attention), T = 0 (pass `--temperatures 1` for T = 1): one process.
cd "$(dirname "$0")/../../.." || exit 1
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s38-cpu-2core --per-half 10 \
    --temperatures 0 --compile "$@"
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s38-cpu-2core --summarise
