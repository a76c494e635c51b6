#!/usr/bin/env bash
# run.sh at T = 1 (top-k 0, top-p 1), with dsbd (sampling only) and without mcsd's default tree and specinfer
# (the slowest at T = 0: 0.45x and 0.35x ar), to fit the session. Runs after the shared-prefix reorder
# (beam-shared-prefix-s40), unlike run.sh.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=1 --method sd:gamma=4 --method mcsd:k_config=2x1 \
  --method mjsd --method mtad --method beam:width=2 --method beam:width=3 --method dsbd \
  --temperature 1 --max-new-tokens 128 --compile --out bench-T1 "$@"
