"""What the float64 tail costs a whole generation: eager bfloat16, the default pair, greedy, 64 new tokens, 12
prompts (6 MT-Bench + 6 Spec-Bench dev, spread). Per prompt and method, the shipped engine (`static.splits`) and
the engine before (`static.splits` patched to None: float32 KEY_BLOCKs throughout) in turn, in one process; the
order alternates by prompt. Prints tokens/s per variant, the median of paired ratios, and how many outputs equal
`ar`'s of the same variant."""

import statistics

from multispec import generate, load_pair
from multispec.bench.prompts import load_prompts
from multispec.models import static

METHODS = ["ar", "sd:gamma=4", "mcsd"]
pair = load_pair(dtype="bfloat16")
prompts = load_prompts(["mt-bench", "spec-bench-dev"], None, 6, True)
shipped = static.splits
speed = {(m, v): [] for m in METHODS for v in ("split", "float32")}
same = {(m, v): 0 for m in METHODS for v in ("split", "float32")}
ids0 = pair.target.encode(prompts[0].text)
for m in METHODS:  # warm-up
    generate(pair.target, pair.draft, ids0, method=m, temperature=0, max_new_tokens=8, score=False)
for i, p in enumerate(prompts):
    ids = pair.target.encode(p.text)
    for variant in ("split", "float32") if i % 2 == 0 else ("float32", "split"):
        static.splits = shipped if variant == "split" else (lambda positions: None)
        ar = None
        for m in METHODS:
            out = generate(pair.target, pair.draft, ids, method=m, temperature=0, max_new_tokens=64, score=False)
            speed[(m, variant)].append(len(out.token_ids) / out.stats["seconds"])
            if m == "ar":
                ar = out.token_ids
            same[(m, variant)] += out.token_ids == ar
    print(p.id, {f"{m}/{v}": round(speed[(m, v)][-1], 1) for m in METHODS for v in ("split", "float32")}, flush=True)
static.splits = shipped
for m in METHODS:
    a, b = speed[(m, "float32")], speed[(m, "split")]
    paired = statistics.median(y / x for x, y in zip(a, b, strict=True))
    print(f"{m:12s} tokens/s median: before {statistics.median(a):.1f}, with the float64 tail {statistics.median(b):.1f};"
          f" paired ratio {paired:.3f}; = ar: {same[(m, 'float32')]}/{len(a)} before, {same[(m, 'split')]}/{len(b)} now")
