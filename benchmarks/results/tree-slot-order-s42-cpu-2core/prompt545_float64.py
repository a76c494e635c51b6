"""Needs float64-values-prototype.diff applied (git apply). Greedy ar and mcsd on spec_bench_dev:545, bfloat16,
48 tokens, with the value cache in float32 (as shipped) and in float64."""

import os

from multispec import generate, load_pair
from multispec.bench.prompts import load_prompts

pair = load_pair(dtype="bfloat16")
p = [p for p in load_prompts(["mt-bench", "spec-bench-dev"], None, 50, True) if p.id == "spec_bench_dev:545"][0]
ids = pair.target.encode(p.text)
for v in ("0", "1"):
    os.environ["MS_F64"] = v
    ar = generate(pair.target, None, ids, method="ar", temperature=0, max_new_tokens=48, score=False).token_ids
    mc = generate(pair.target, pair.draft, ids, method="mcsd", temperature=0, max_new_tokens=48, score=False).token_ids
    first = next((i for i, (a, b) in enumerate(zip(ar, mc, strict=False)) if a != b), None)
    print(
        "float64 values" if v == "1" else "float32 values", "mcsd == ar:", ar == mc, "first difference at token", first
    )
