#!/bin/sh
# Optimal trees, tree=auto and `multispec tune` on held-out halves of 10 + 10 prompts per category (2026-11-28,
# host `vm`): plain `--compile` runs the target's steps batch-invariant on the dpbf16 kernel with its calibrated
# prefetch. T = 0, then T = 1, one process each. Rows are appended; a rerun skips the finished ones.
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/optimal-trees
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 0 --compile "$@" > $OUT/run-T0.log 2>&1
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 1 --compile "$@" > $OUT/run-T1.log 2>&1
python benchmarks/optimal_trees.py --out $OUT --summarise
