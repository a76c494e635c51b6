#!/bin/sh
# Issue 31's 10 + 10 protocol on the compiled engine as of session 46 (sd priced from sd runs of two lengths,
# tune's candidates measured prompt by prompt), T = 0 and 1, categories in turn (both temperatures of one before
# the next): one process. Rows are appended; a rerun skips the finished ones.
cd "$(dirname "$0")/../../.." || exit 1
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s46-cpu-2core --per-half 10 \
    --temperatures 0 1 --compile "$@"
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s46-cpu-2core --summarise
