#!/bin/sh
# tree=auto priced per kind of iteration (session 39) against the same controller priced as before (no factors,
# a plain step's work = a drafting iteration's), ar, sd gamma 1 and the tuned plan: issue 31's 10 + 10 protocol
# (tune on 10 prompts, measure on 10 others) on the four combos where tree=auto lost most in session 38. One process.
cd "$(dirname "$0")/../../.." || exit 1
python benchmarks/optimal_trees.py --out benchmarks/results/tree-auto-kinds-s39-cpu-2core --per-half 10 \
    --temperatures 0 1 --only qa-T1 translation-T1 mt-bench-T1 math_reasoning-T0 --compile --unscaled-auto \
    --methods ar sd:gamma=1 mcsd:tree=auto mcsd:tree=auto,unscaled plan "$@"
python benchmarks/optimal_trees.py --out benchmarks/results/tree-auto-kinds-s39-cpu-2core --summarise
