#!/bin/sh
# T = 1 of the protocol, after the bucket route (commit ecb0e7a and later): one process.
cd "$(dirname "$0")/../../.." || exit 1
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s28-cpu-2core --per-half 10 \
    --temperatures 1 --compile "$@"
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s28-cpu-2core --summarise
