#!/bin/sh
# Session 54 (2026-11-28, host `vm`): the attention kernel in blocks of rows and the bfloat16 cache.
# kernel_ab.py: dpbf16.attend before and now, bits and per-layer times; cache_ab.py: the target's compiled step
# with its cache in bfloat16 and in float32, one process, interleaved; then issue 29's cost curve.
cd "$(dirname "$0")/../../.." || exit 1
DIR=benchmarks/results/attention-kv-s54-cpu-2core
python $DIR/kernel_ab.py 2>&1 | tee $DIR/kernel_ab.log
python $DIR/cache_ab.py 2>&1 | grep -v "^multispec: loaded" | tee $DIR/cache_ab.log
rm -f $DIR/cost_curve.jsonl
python benchmarks/cost_curve.py --out $DIR/cost_curve.jsonl --engines compiled --dtypes bfloat16 2>&1 \
  | grep -v "^multispec: loaded" | tee $DIR/run.log
