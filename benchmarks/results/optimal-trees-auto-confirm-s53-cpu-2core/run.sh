#!/bin/sh
# The shipped tree=auto (session 53's last commit: probes only where the draft has read the context) against ar,
# sd gamma 1 and the plan, on the same held-out halves, with the plans tune wrote in
# optimal-trees-auto-s53-cpu-2core (copied here, so tune does not run again). 2026-11-28, host `vm`.
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/optimal-trees-auto-confirm-s53-cpu-2core
M="ar sd:gamma=1 mcsd:tree=auto plan"
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 0 --compile --methods $M "$@" > $OUT/run-T0.log 2>&1
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 1 --compile --methods $M "$@" > $OUT/run-T1.log 2>&1
python benchmarks/optimal_trees.py --out $OUT --summarise
