#!/usr/bin/env bash
# The same prompts with --compile, ar against stock transformers only (time: a fresh machine compiles each
# shape the first time; the compiles happen in the bench's warm-up, outside timed rows).
set -euo pipefail
cd "$(dirname "$0")"
multispec bench --prompts spec-bench-dev --limit 24 --spread \
  --method ar --method hf \
  --temperature 0 --max-new-tokens 128 --compile --out bench-compiled "$@"
