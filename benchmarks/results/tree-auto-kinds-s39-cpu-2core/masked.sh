#!/bin/sh
# As run.sh after trees were priced on the masked forward's curve in tune and tree=auto (commit cdef144), with
# fresh tunes (their tree factor is now measured against that curve). A third process.
cd "$(dirname "$0")/../../.." || exit 1
python benchmarks/optimal_trees.py --out benchmarks/results/tree-auto-kinds-s39-cpu-2core/masked --per-half 10 \
    --temperatures 0 1 --only qa-T1 translation-T1 mt-bench-T1 math_reasoning-T0 --compile --unscaled-auto \
    --methods ar sd:gamma=1 mcsd:tree=auto mcsd:tree=auto,unscaled plan "$@"
python benchmarks/optimal_trees.py --out benchmarks/results/tree-auto-kinds-s39-cpu-2core/masked --summarise
