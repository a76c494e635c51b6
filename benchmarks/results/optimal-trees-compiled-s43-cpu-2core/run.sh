#!/bin/sh
# Issue 31's 10 + 10 protocol on the compiled engine as of session 43 (tree=auto priced per kind of iteration, a
# chain's own work line, draft forwards without batch invariance), T = 0 (pass `--temperatures 1` for T = 1): one
# process.
cd "$(dirname "$0")/../../.." || exit 1
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s43-cpu-2core --per-half 10 \
    --temperatures 0 --compile "$@"
python benchmarks/optimal_trees.py --out benchmarks/results/optimal-trees-compiled-s43-cpu-2core --summarise
