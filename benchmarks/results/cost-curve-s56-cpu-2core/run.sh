#!/bin/sh
# Issue 29's cost curve on the step of session 55 (2026-11-28, host `vm`): T(k, c) for the default pair on the
# compiled bfloat16 engine, beside the bound (the weights' bytes over the read bandwidth measured in the same
# run). `compiled`: the fast step (a draft's); `invariant`: the batch-invariant step `--compile` runs a target on
# here. The eager engines and float32 are unchanged since session 47's curve (`../cost-curve-s47-cpu-2core/`),
# and were not run again (time).
cd "$(dirname "$0")/../../.." || exit 1
OUT=benchmarks/results/cost-curve-s56-cpu-2core/cost_curve.jsonl
rm -f "$OUT"
python benchmarks/cost_curve.py --out "$OUT" --engines compiled,invariant --dtypes bfloat16
