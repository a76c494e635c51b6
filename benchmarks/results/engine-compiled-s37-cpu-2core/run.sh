#!/usr/bin/env bash
# Issue 29's bench, compiled, on the 24 Spec-Bench dev prompts of engine-eager-s36 (spread over the
# categories), 128 new tokens, one process, T = 0 (`T=1 ./run.sh` for T = 1 into bench-T1): our one-row methods against every transformers peer.
# Methods on several rows (beam, dsbd, batch-sd, mjsd) compile further shapes and are left out here.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts spec-bench-dev --limit 24 --spread --compile \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 --method sd:gamma=4 \
  --method mcsd --method specinfer \
  --method hf --method hf-static --method hf-lookup --method hf-assisted \
  --temperature "${T:-0}" --max-new-tokens 128 --out "bench${T:+-T$T}" "$@"
