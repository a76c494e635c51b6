"""Greedy speculative methods against greedy ar on the default pair in one dtype: on how many prompts the
tokens are the same, and where the first difference falls. Prompts: MT-Bench and Spec-Bench dev, spread,
n/2 each.

    python benchmarks/greedy_drift.py bfloat16 100 48 sd:gamma=4 mcsd specinfer > drift-bf16.json
    python benchmarks/greedy_drift.py bfloat16 30 48 sd:gamma=4 mcsd --compile > drift-compiled.json
    python benchmarks/greedy_drift.py bfloat16 100 48 sd:gamma=4 mcsd --compile=invariant > drift-invariant.json
    python benchmarks/greedy_drift.py bfloat16 100 48 sd:gamma=4 mcsd --device=cuda --rows=rows.jsonl > drift-cuda.json

With --rows=FILE each prompt's rows are appended to FILE as they finish, so a run cut short keeps them.
"""

import json
import sys

from multispec import generate, load_pair
from multispec.tools.bench.prompts import load_prompts


def main(
    dtype: str,
    n: int,
    tokens: int,
    methods: list[str],
    compile: bool | str = False,
    device: str | None = None,
    rows_file: str | None = None,
) -> dict:
    pair = load_pair(dtype=dtype, compile=compile, device=device)
    prompts = load_prompts(["mt-bench", "spec-bench-dev"], None, n // 2, True)
    rows = []
    for p in prompts:
        ids = pair.target.encode(p.text)
        ar = generate(pair.target, None, ids, method="ar", temperature=0, max_new_tokens=tokens, score=False)
        for method in methods:
            out = generate(
                pair.target, pair.draft, ids, method=method, temperature=0, max_new_tokens=tokens, score=False
            )
            a, s = ar.token_ids, out.token_ids
            first = next((i for i, (x, y) in enumerate(zip(a, s, strict=False)) if x != y), None)
            rows.append({"prompt": p.id, "method": method, "same": a == s, "first_difference": first})
            if rows_file:
                with open(rows_file, "a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
    return {
        "dtype": dtype,
        "compile": compile,
        "device": str(pair.target.device),
        "prompts": len(prompts),
        "tokens": tokens,
        "same": {m: sum(r["same"] for r in rows if r["method"] == m) for m in methods},
        "rows": rows,
    }


if __name__ == "__main__":
    flags = [a for a in sys.argv[4:] if a.startswith("--")]
    methods = [a for a in sys.argv[4:] if not a.startswith("--")] or ["sd:gamma=4"]
    device = next((a.split("=", 1)[1] for a in flags if a.startswith("--device=")), None)
    rows_file = next((a.split("=", 1)[1] for a in flags if a.startswith("--rows=")), None)
    compile = "invariant" if "--compile=invariant" in flags else "--compile" in flags
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), methods, compile, device, rows_file)))
