#!/bin/sh
# The same held-out halves and plan files as run.sh, after tree=auto's search was cut to the trees of up to 16 nodes
# first (commit e8b61e8): a second process, so its ratios are this run's own.
cd "$(dirname "$0")/../../.." || exit 1
python benchmarks/optimal_trees.py --out benchmarks/results/tree-auto-kinds-s39-cpu-2core/rerun --per-half 10 \
    --temperatures 0 1 --only qa-T1 translation-T1 mt-bench-T1 math_reasoning-T0 --compile --unscaled-auto \
    --methods ar sd:gamma=1 mcsd:tree=auto mcsd:tree=auto,unscaled plan "$@"
python benchmarks/optimal_trees.py --out benchmarks/results/tree-auto-kinds-s39-cpu-2core/rerun --summarise
