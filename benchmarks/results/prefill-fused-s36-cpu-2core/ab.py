"""A/B of the fused prompt attention (`fused_prefix`): the default pair as loaded here (bfloat16 on this host),
eager, greedy, 32 new tokens, 4 Spec-Bench dev prompts per category; `ar` and `sd` γ 4, each prompt run
off / on / off / on in one process (off: `HFModel.forward` called without `fused_prefix`, the engine before the
change). One JSON line per prompt and method: the best seconds and prefill seconds of each mode, whether the
tokens of the two modes agree.

    python benchmarks/results/prefill-fused-s36-cpu-2core/ab.py > benchmarks/results/prefill-fused-s36-cpu-2core/ab.jsonl
"""

import json

import torch

from multispec.api import generate, load_pair
from multispec.bench.prompts import load_prompts
from multispec.models.hf import HFModel

fused_forward = HFModel.forward


def forward_off(self, cache, tokens, *args, fused_prefix=0, **kwargs):
    return fused_forward(self, cache, tokens, *args, **kwargs)


def main():
    torch.set_num_threads(2)
    pair = load_pair()
    prompts = load_prompts(["spec-bench-dev"], None, 24, True)
    for method in ("ar", "sd:gamma=4"):
        for p in prompts:
            runs = {"off": [], "on": []}
            for mode in ("off", "on", "off", "on"):
                HFModel.forward = fused_forward if mode == "on" else forward_off
                r = generate(pair.target, pair.draft, p.text, method=method, max_new_tokens=32, temperature=0.0,
                             score=False)
                runs[mode].append((r.stats["seconds"], r.stats["prefill_seconds"], r.token_ids))
            print(json.dumps({
                "prompt": p.id, "category": p.category, "method": method, "dtype": str(pair.target.dtype),
                "prompt_tokens": len(pair.target.encode(p.text)),
                **{f"seconds_{m}": min(x[0] for x in runs[m]) for m in runs},
                **{f"prefill_{m}": min(x[1] for x in runs[m]) for m in runs},
                "same_tokens": runs["on"][0][2] == runs["off"][0][2]}), flush=True)


if __name__ == "__main__":
    main()
