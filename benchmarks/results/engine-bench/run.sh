#!/usr/bin/env bash
# Every method and peer, compiled bfloat16, on the 60 prompts of prompts.jsonl (2026-11-28, host `vm`): 128 tokens,
# T = 0 and 1, one process, the peers in the same process. The target's steps batch-invariant on the dpbf16
# kernel, the draft's on the batch-invariant dpbf16 variant where it won this machine's race, gamma=auto pricing
# an iteration's work besides forwards. Methods: ar, the default, sd gamma 1 and 4, mcsd (2x1), specinfer, mjsd and
# mtad at their papers' settings, beam widths 2 and 3, dsbd (sampling only: T = 1); peers hf, hf-lookup,
# hf-assisted and llama-cpp (llama-cpp-python 0.3.36, built here with the README's flags). `hf-static` is left out.
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts prompts.jsonl \
  --method ar --method sd:gamma=auto,drafter=hybrid --method sd:gamma=1 --method sd:gamma=4 \
  --method mcsd:k_config=2x1 --method specinfer --method mjsd --method mtad \
  --method beam:width=2 --method beam:width=3 --method dsbd \
  --method hf --method hf-lookup --method hf-assisted --method llama-cpp \
  --temperature 0 --temperature 1 --max-new-tokens 128 --compile --out bench "$@"
python ../../engine_goals.py bench/results.jsonl > goals.md
