#!/bin/sh
# Issue 29's cost curve with the `+concat` kernel variants (session 48, 2026-11-27, host `vm`): T(k, c) for the
# default pair on the compiled bfloat16 engine, beside the bound (weights' bytes / measured read bandwidth). The
# eager engines did not change since session 47 (cost-curve-s47-cpu-2core).
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/cost-curve-s48-cpu-2core/cost_curve.jsonl
rm -f "$OUT"
python benchmarks/cost_curve.py --out "$OUT" --engines compiled --dtypes bfloat16
