#!/bin/sh
# Session 53's first protocol run, T = 0 only (T = 1 was stopped): tree=auto with the first call priced as a steady
# iteration and a prior skipping the one-node tries, as tune then offered it (every measured price, the prior
# pooled over depths), beside the offering of sessions 39-52 (`unscaled`: overhead A/B/A, no factors).
# 2026-11-28, host `vm`. Code at commit "tree=auto: the first call priced as a steady iteration ...".
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/optimal-trees-auto-pooled-s53-cpu-2core
M="ar sd:gamma=1 sd:gamma=2 mcsd:tree=auto mcsd:tree=auto,unscaled plan"
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 0 --compile --unscaled-auto --methods $M "$@" > $OUT/run-T0.log 2>&1
python benchmarks/optimal_trees.py --out $OUT --summarise
