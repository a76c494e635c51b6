#!/bin/sh
# tree=auto with a chain's own work line (session 40: overhead A/B/C/D/E, C from ar, D/E through a one-node and
# a four-node mcsd chain on one prompt) against the same prior priced as session 39's tune wrote it (A/B/A), ar,
# sd gamma 1 and the tuned plan: issue 31's 10 + 10 protocol (tune on 10 prompts, measure on the 10 next) on the
# four combos of tree-auto-kinds-s39. One process.
cd "$(dirname "$0")/../../.." || exit 1
python benchmarks/optimal_trees.py --out benchmarks/results/tree-auto-chain-s40-cpu-2core --per-half 10 \
    --temperatures 0 1 --only qa-T1 translation-T1 mt-bench-T1 math_reasoning-T0 --compile --unscaled-auto \
    --methods ar sd:gamma=1 mcsd:tree=auto mcsd:tree=auto,unscaled plan "$@"
python benchmarks/optimal_trees.py --out benchmarks/results/tree-auto-chain-s40-cpu-2core --summarise
