#!/usr/bin/env bash
# The seeds' joint methods (mjsd, mtad at their defaults: draft beams of width 8) compiled, against ar and sd
# on the same 24 Spec-Bench dev prompts, 128 new tokens, one process, T = 0 (`T=1 ./run-joint.sh` for T = 1).
# The draft's 8-row shapes compile in the warm-up (the target verifies one row, as for sd).
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts spec-bench-dev --limit 24 --spread --compile \
  --method ar --method sd:gamma=1 --method sd:gamma=4 --method mjsd --method mtad \
  --temperature "${T:-0}" --max-new-tokens 128 --out "bench-joint${T:+-T$T}" "$@"
