#!/bin/sh
# The cost curve of the default pair on the compiled bfloat16 engine (2026-11-28, host `vm`): T(k, c) beside the
# bound (the weights' bytes over the read bandwidth measured in the same run). `compiled`: the fast step (a
# draft's); `invariant`: the batch-invariant step `--compile` runs a target on here. The eager engines and float32
# are not run (time).
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/cost-curve/cost_curve.jsonl
rm -f "$OUT"
python benchmarks/cost_curve.py --out "$OUT" --engines compiled,invariant --dtypes bfloat16
