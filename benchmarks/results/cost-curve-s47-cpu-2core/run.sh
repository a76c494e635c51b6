#!/bin/sh
# Issue 29's cost curve after the in-place cache writes (session 47, 2026-11-27, host `vm`): T(k, c) for the
# default pair, bfloat16 on every engine and float32 on the eager ones (compiled float32 would compile 14 new
# steps per model first, ~40 minutes: not run), beside the bound (weights' bytes / measured read bandwidth).
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/cost-curve-s47-cpu-2core/cost_curve.jsonl
rm -f "$OUT"
python benchmarks/cost_curve.py --out "$OUT" --engines dynamic,static,compiled --dtypes bfloat16
python benchmarks/cost_curve.py --out "$OUT" --engines dynamic,static --dtypes float32
