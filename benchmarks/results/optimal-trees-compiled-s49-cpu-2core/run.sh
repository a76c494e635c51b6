#!/bin/sh
# Issue 31's 10 + 10 protocol on the step with our `dpbf16` kernel variant (session 49, 2026-11-27, host `vm`):
# T = 0 only (session 48 ran T = 0 and 1 on the previous step: ../optimal-trees-compiled-s48-cpu-2core). Rows are
# appended; a rerun skips the finished ones.
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/optimal-trees-compiled-s49-cpu-2core
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 0 --compile "$@"
python benchmarks/optimal_trees.py --out $OUT --summarise
