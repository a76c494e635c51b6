"""Decoding speed of whole greedy generations on the default pair in bfloat16, one engine per process: eager,
compiled (as shipped) or compiled batch-invariant. Six Spec-Bench dev prompts (one per category, spread), 64
new tokens, transformers' own `generate` on the same target (as it ships, `hf`), then `ar`, `sd:gamma=4` and the
default method; tokens/s from `stats` (decoding: prefill in, one-time compiles out), a warm-up generation first per
method; session 45 added the target's milliseconds per call (compiled-invariant-packaged-s45 ran it so):

    python benchmarks/results/compiled-invariant-s44-cpu-2core/gen_speed.py invariant
"""

import json
import sys

from multispec import generate, load_pair
from multispec.bench.prompts import load_prompts
from multispec.bench.runner import hf_generate
from multispec.warp import Sampling

METHODS = ["ar", "sd:gamma=4", "sd:gamma=auto,drafter=hybrid"]


def main(mode: str) -> None:
    compile = {"eager": False, "compiled": True, "invariant": "invariant"}[mode]
    pair = load_pair(dtype="bfloat16", compile=compile)
    prompts = load_prompts(["spec-bench-dev"], None, 6, True)
    greedy = Sampling(temperature=0)
    hf_generate(pair.target, None, pair.target.encode(prompts[0].text), 64, greedy, 0)  # warm-up
    tokens = seconds = 0.0
    for p in prompts:
        out, stats = hf_generate(pair.target, None, pair.target.encode(p.text), 64, greedy, 0)
        tokens += len(out)
        seconds += stats["seconds"]
    print(json.dumps({"mode": mode, "method": "hf", "prompts": len(prompts), "tokens": tokens,
                      "tokens_per_second": round(tokens / seconds, 2)}), flush=True)
    for method in METHODS:
        generate(pair.target, pair.draft, pair.target.encode(prompts[0].text), method=method, temperature=0,
                 max_new_tokens=64, score=False)  # warm-up: compiles and cost curves stay out of the rows
        tokens = seconds = target = calls = 0.0
        for p in prompts:
            out = generate(pair.target, pair.draft, pair.target.encode(p.text), method=method, temperature=0,
                           max_new_tokens=64, score=False)
            tokens += len(out.token_ids)
            seconds += out.stats["seconds"]
            target += out.stats["target_seconds"] - out.stats["prefill_seconds"]
            calls += out.stats["target_calls"] - 1
        print(json.dumps({"mode": mode, "method": method, "prompts": len(prompts), "tokens": tokens,
                          "tokens_per_second": round(tokens / seconds, 2),
                          "target_ms_per_call": round(1e3 * target / calls, 2)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
