#!/bin/sh
# Issue 29's cost curve with the `dpbf16` kernel variant (session 49, 2026-11-27, host `vm`): T(k, c) for the
# default pair on the compiled bfloat16 engine, beside the bound. The first use of each shape races the stored
# kernel choice (s48's) against the new variant and keeps the faster.
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/cost-curve-s49-cpu-2core/cost_curve.jsonl
rm -f "$OUT"
python benchmarks/cost_curve.py --out "$OUT" --engines compiled --dtypes bfloat16
