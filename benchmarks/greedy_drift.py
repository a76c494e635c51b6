"""Greedy sd (gamma 4) against greedy ar on the default pair in one dtype: on how many prompts the tokens are
the same, and where the first difference falls. Prompts: MT-Bench and Spec-Bench dev, spread, n/2 each.

    python benchmarks/greedy_drift.py bfloat16 30 48 > drift-bf16.json
"""

import json
import sys

from multispec import generate, load_pair
from multispec.bench.prompts import load_prompts


def main(dtype: str, n: int, tokens: int) -> dict:
    pair = load_pair(dtype=dtype)
    prompts = load_prompts(["mt-bench", "spec-bench-dev"], None, n // 2, True)
    rows = []
    for p in prompts:
        ids = pair.target.encode(p.text)
        ar = generate(pair.target, None, ids, method="ar", temperature=0, max_new_tokens=tokens, score=False)
        sd = generate(pair.target, pair.draft, ids, method="sd", gamma=4, temperature=0, max_new_tokens=tokens,
                      score=False)
        a, s = ar.token_ids, sd.token_ids
        first = next((i for i, (x, y) in enumerate(zip(a, s, strict=False)) if x != y), None)
        rows.append({"prompt": p.id, "same": a == s, "first_difference": first})
    return {"dtype": dtype, "prompts": len(prompts), "tokens": tokens, "same": sum(r["same"] for r in rows),
            "rows": rows}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
