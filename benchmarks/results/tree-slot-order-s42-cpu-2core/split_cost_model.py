"""One process, alternating: eager bf16 forwards with the split sums (static.splits, as shipped for a target)
and without (static.splits patched to None: float32 blocks throughout, the engine before). The target's one-token
step and a 29-row masked forward after a 100-token and an 868-token prompt (spec_bench_dev:545's), and the draft's
step as its runner calls it (batch_invariant=False) against the draft step as before (padded to min_rows)."""

import statistics
import time

import torch

from multispec import load_pair
from multispec.bench.prompts import load_prompts
from multispec.models import static

pair = load_pair(dtype="bfloat16")
t, dr = pair.target, pair.draft
p = [p for p in load_prompts(["mt-bench", "spec-bench-dev"], None, 50, True) if p.id == "spec_bench_dev:545"][0]
long_ids = t.encode(p.text)
shipped = static.splits
res = {}
with torch.inference_mode():
    for _rnd in range(8):
        for variant in ("new", "old"):
            static.splits = shipped if variant == "new" else (lambda pos: None)
            for ids in (long_ids[:100], long_ids):
                L = len(ids)
                for model, key, inv in ((t, "target step", True), (dr, "draft step", variant == "old")):
                    cache = model.new_cache()
                    model.forward(cache, torch.tensor([ids]), logits_to_keep=1, fused_prefix=L - 1, batch_invariant=inv)
                    tt = []
                    for i in range(16):
                        t0 = time.perf_counter()
                        model.forward(cache, torch.tensor([[ids[i]]]), logits_to_keep=1, batch_invariant=inv)
                        tt.append(time.perf_counter() - t0)
                    res.setdefault((key, L, variant), []).append(statistics.median(tt))
                cache = t.new_cache()
                t.forward(cache, torch.tensor([ids]), logits_to_keep=1, fused_prefix=L - 1)
                mask = torch.ones(1, 29, L + 29, dtype=torch.bool).tril(L)
                tt = []
                for _ in range(6):
                    t0 = time.perf_counter()
                    t.forward(
                        cache,
                        torch.tensor([ids[:29]]),
                        positions=torch.arange(L, L + 29)[None],
                        mask=mask,
                        logits_to_keep=29,
                    )
                    tt.append(time.perf_counter() - t0)
                    cache.crop(L)
                res.setdefault(("target 29-row forward", L, variant), []).append(statistics.median(tt))
static.splits = shipped
for key in sorted({(k, L) for k, L, _ in res}):
    a, b = statistics.median(res[(*key, "old")]), statistics.median(res[(*key, "new")])
    paired = statistics.median(y / x for x, y in zip(res[(*key, "old")], res[(*key, "new")], strict=True))
    print(
        f"{key[0]:24s} after {key[1]:4d} tokens: before {a * 1e3:7.2f} ms, now {b * 1e3:7.2f} ms, ratio of medians "
        f"{b / a:.3f}, median of paired ratios {paired:.3f}"
    )
