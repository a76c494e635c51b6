#!/bin/sh
# Issue 31's 10 + 10 protocol after session 52's fixes to tune's prediction (warm-up before timing, ar priced from
# three prompts, the prompt's forward spread over the length pooled from every tune run). 2026-11-28, host `vm`.
# Only the rows the prediction and the plan are compared against: ar, sd gamma 1 and 2 (sd gamma 1 was the best
# fixed method in all 12 combos of session 51), the 16-node k-config 8x1, tree=auto and the plan. The optimal-tree
# block efficiencies are session 51's (benchmarks/results/optimal-trees-compiled-s51-cpu-2core): nothing here
# changes them. Rows are appended; a rerun skips the finished ones.
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/optimal-trees-tune-s52-cpu-2core
M="ar sd:gamma=1 sd:gamma=2 mcsd:k_config=8x1 mcsd:tree=auto plan"
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 0 --compile --methods $M "$@" > $OUT/run-T0.log 2>&1
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 1 --compile --methods $M "$@" > $OUT/run-T1.log 2>&1
python benchmarks/optimal_trees.py --out $OUT --summarise
