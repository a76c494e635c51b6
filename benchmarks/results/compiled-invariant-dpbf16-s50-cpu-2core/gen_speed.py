"""Session 44's gen_speed.py (six Spec-Bench dev prompts, one per category, 64 tokens, greedy; transformers'
`generate` on the same target in every process; tokens/s from `stats`, one-time costs out) with two modes:
`default` (`--compile` as shipped: here its steps are batch-invariant, on our kernels) and `fast` (the same, with
the batch-invariant choice turned off in this process: the fast compiled step, kernels raced per shape).

    python benchmarks/results/compiled-invariant-dpbf16-s50-cpu-2core/gen_speed.py default|fast
"""

import json
import sys

from multispec import generate, load_pair
from multispec.bench.prompts import load_prompts
from multispec.bench.runner import hf_generate
from multispec.warp import Sampling

METHODS = ["ar", "sd:gamma=4", "sd:gamma=auto,drafter=hybrid"]


def main(mode: str) -> None:
    pair = load_pair(dtype="bfloat16", compile=True)
    if mode == "fast":
        pair.target._exact = False  # decided: not batch-invariant
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
        print(json.dumps({"mode": mode, "kernel": pair.target.kernel, "method": method, "prompts": len(prompts),
                          "tokens": tokens, "tokens_per_second": round(tokens / seconds, 2),
                          "target_ms_per_call": round(1e3 * target / calls, 2)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
