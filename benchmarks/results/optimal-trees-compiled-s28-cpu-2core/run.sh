#!/bin/sh
# Issue 31's 10 + 10 protocol on the compiled bfloat16 engine (session 28, one process per invocation).
cd "$(dirname "$0")/../../.." || exit 1
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s28-cpu-2core --per-half 10 \
    --temperatures 0 --compile "$@"
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s28-cpu-2core --summarise
