#!/bin/sh
# Issue 31's 10 + 10 protocol with the `+concat` kernel variants (session 48, 2026-11-27, host `vm`): T = 0 (as in
# session 47, for the comparison), then T = 1 (not run since the in-place cache writes), one process each. Rows
# are appended; a rerun skips the finished ones.
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/optimal-trees-compiled-s48-cpu-2core
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 0 --compile "$@"
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 1 --compile "$@"
python benchmarks/optimal_trees.py --out $OUT --summarise
