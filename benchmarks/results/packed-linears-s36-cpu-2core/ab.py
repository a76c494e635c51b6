"""A/B of packed linear maps on eager steps (`multispec.models.linears`): the default pair as loaded here,
eager, greedy, 64 new tokens, 12 Spec-Bench dev prompts (2 per category, spread); `ar` and the default method
with two pairs in one process, one with packing off (`packed_linears = False` before its first step), one
with packing chosen by `linears.pack` as a user gets it; per prompt plain / packed / plain / packed, best of two.

    python benchmarks/results/packed-linears-s36-cpu-2core/ab.py > benchmarks/results/packed-linears-s36-cpu-2core/ab.jsonl
"""

import json
import sys

import torch

from multispec.api import generate, load_pair
from multispec.bench.prompts import load_prompts
from multispec.models import linears


def main():
    torch.set_num_threads(2)
    plain, packed = load_pair(), load_pair()
    plain.target.packed_linears = plain.draft.packed_linears = False
    prompts = load_prompts(["spec-bench-dev"], None, 12, True)
    for method in ("ar", "sd:gamma=auto,drafter=hybrid"):
        for p in prompts:
            runs = {"plain": [], "packed": []}
            for mode in ("plain", "packed", "plain", "packed"):
                pair = plain if mode == "plain" else packed
                r = generate(pair.target, pair.draft, p.text, method=method, max_new_tokens=64, temperature=0.0,
                             score=False)
                st = r.stats
                runs[mode].append((st["seconds"], st["target_seconds"] / st["target_calls"], r.token_ids))
            print(json.dumps({
                "prompt": p.id, "category": p.category, "method": method, "dtype": str(packed.target.dtype),
                "packed_chosen": [packed.target.packed_linears, packed.draft.packed_linears],
                **{f"seconds_{m}": min(x[0] for x in runs[m]) for m in runs},
                **{f"target_ms_per_call_{m}": 1e3 * min(x[1] for x in runs[m]) for m in runs},
                "same_tokens": runs["plain"][0][2] == runs["packed"][0][2]}), flush=True)
    print(json.dumps({"choices": {str(k): v for k, v in linears._CHOICES.items()}}), file=sys.stderr)


if __name__ == "__main__":
    main()
