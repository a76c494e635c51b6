#!/bin/sh
# Issue 31's 10 + 10 protocol at T = 0 after the in-place cache writes (session 47; compiled steps of
# STEP_VERSION 2, cheaper at every width): one process. Rows are appended; a rerun skips the finished ones.
cd "$(dirname "$0")/../../.." || exit 1
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s47-cpu-2core --per-half 10 \
    --temperatures 0 --compile "$@"
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s47-cpu-2core --summarise
