"""Needs float64-values-prototype.diff applied (git apply). One process, the two value types alternating (4
rounds): the default target's one-token step and a 29-row masked forward after spec_bench_dev:545's prompt
(868 tokens), and the draft's step."""

import os
import statistics
import time

import torch

from multispec import load_pair
from multispec.bench.prompts import load_prompts

pair = load_pair(dtype="bfloat16")
t = pair.target
p = [p for p in load_prompts(["mt-bench", "spec-bench-dev"], None, 50, True) if p.id == "spec_bench_dev:545"][0]
ids = t.encode(p.text)
res = {"0": {"step": [], "tree": [], "dstep": []}, "1": {"step": [], "tree": [], "dstep": []}}
mask = torch.ones(1, 29, 868 + 29, dtype=torch.bool).tril(868)
with torch.inference_mode():
    for _rnd in range(4):
        for v in ("0", "1"):
            os.environ["MS_F64"] = v
            for model, key in ((t, "step"), (pair.draft, "dstep")):
                cache = model.new_cache()
                model.forward(cache, torch.tensor([ids]), logits_to_keep=1, fused_prefix=len(ids) - 1)
                tt = []
                for i in range(24):
                    t0 = time.perf_counter()
                    model.forward(cache, torch.tensor([[ids[i]]]), logits_to_keep=1)
                    tt.append(time.perf_counter() - t0)
                res[v][key].append(statistics.median(tt))
            cache.crop(len(ids))
            cache = t.new_cache()
            t.forward(cache, torch.tensor([ids]), logits_to_keep=1, fused_prefix=len(ids) - 1)
            tt = []
            for _ in range(8):
                t0 = time.perf_counter()
                t.forward(
                    cache,
                    torch.tensor([ids[:29]]),
                    positions=torch.arange(868, 897)[None],
                    mask=mask,
                    logits_to_keep=29,
                )
                tt.append(time.perf_counter() - t0)
                cache.crop(len(ids))
            res[v]["tree"].append(statistics.median(tt))
for k in ("step", "tree", "dstep"):
    a, b = statistics.median(res["0"][k]), statistics.median(res["1"][k])
    print(
        k,
        f"f32 {a * 1e3:.2f} ms  f64 {b * 1e3:.2f} ms  ratio {b / a:.3f}",
        [f"{x * 1e3:.1f}" for x in res["1"][k]],
        [f"{x * 1e3:.1f}" for x in res["0"][k]],
    )
