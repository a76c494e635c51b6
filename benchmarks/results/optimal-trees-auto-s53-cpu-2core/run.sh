#!/bin/sh
# Issue 31's 10 + 10 protocol after session 53's changes to tree=auto and to what tune offers as tree=auto.
# tree=auto: the first call priced as a steady iteration; a prior skips the one-node tries; a prior by depth
# (the rates tune's table used); a probe (one one-node chain) every 16 calls while plain steps are chosen; a draft
# catch-up spread over the tokens left; drafting only where priced 5 % faster than a plain step. tune offers it
# with every measured price (each kind's work and forward factors). Beside it: the offering of sessions 39-52
# (overhead A/B/A, no factors: `unscaled`) and the controller without probes, without the margin, and without
# both (--auto-variants). 2026-11-28, host `vm`. Rows are appended; a rerun skips the finished ones.
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/optimal-trees-auto-s53-cpu-2core
M="ar sd:gamma=1 mcsd:tree=auto mcsd:tree=auto,unscaled mcsd:tree=auto,probe=0 mcsd:tree=auto,margin=0 mcsd:tree=auto,probe=0,margin=0 plan"
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 0 --compile --unscaled-auto --auto-variants --methods $M "$@" > $OUT/run-T0.log 2>&1
python benchmarks/optimal_trees.py --out $OUT --per-half 10 --temperatures 1 --compile --unscaled-auto --auto-variants --methods $M "$@" > $OUT/run-T1.log 2>&1
python benchmarks/optimal_trees.py --out $OUT --summarise
