#!/bin/sh
# Session 51 (2026-11-27, host `vm`): the dpbf16 kernel's weight prefetch. ab.py: the pair's compiled steps with
# the calibrated prefetch against none, in one process; then issue 29's cost curve on the new build.
cd "$(dirname "$0")/../../.." || exit 1
DIR=benchmarks/results/prefetch-s51-cpu-2core
python $DIR/ab.py 2>&1 | grep -v "^multispec: loaded" | tee $DIR/ab.log
rm -f $DIR/cost_curve.jsonl
python benchmarks/cost_curve.py --out $DIR/cost_curve.jsonl --engines compiled --dtypes bfloat16 2>&1 | tee $DIR/run.log
