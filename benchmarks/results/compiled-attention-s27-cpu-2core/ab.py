"""Compiled steps with the opaque batch-invariant attention (`attend`, before) against attention traced into the
graph (`attend_traced`, after), in one process: two copies of each model, compiled once per variant and
bucket, timed in interleaved rounds at one context length. Milliseconds, medians.

    python benchmarks/results/compiled-attention-s27-cpu-2core/ab.py [--context 300] [--rounds 15]
"""

import argparse
import json
import statistics
import time

import torch

from multispec.api import load_model
from multispec.models import static

ap = argparse.ArgumentParser()
ap.add_argument("--context", type=int, default=300)
ap.add_argument("--rounds", type=int, default=15)
ap.add_argument("--target-tokens", default="1,4,16")
ap.add_argument("--draft-tokens", default="1")
args = ap.parse_args()
gen = torch.Generator().manual_seed(0)
prompt = torch.randint(1000, (1, args.context), generator=gen)
results = {}
for which, ks in (("draft", args.draft_tokens), ("target", args.target_tokens)):
    ks = [int(k) for k in ks.split(",")]
    models = {}
    for variant in ("opaque", "traced"):
        static.TRACED_ATTENTION = variant == "traced"
        m = load_model("smollm2-135m-instruct-draft" if which == "draft" else None, compile=True)
        cache = m.new_cache()
        m.forward(cache, prompt)
        for k in ks:  # compiles this variant's graph for k (the flag is read while tracing)
            m.forward(cache, prompt[:, :k])
            m.crop(cache, args.context)
        models[variant] = (m, cache)
    times = {(v, k): [] for v in models for k in ks}
    for _ in range(args.rounds):
        for k in ks:
            for v, (m, cache) in models.items():
                t0 = time.perf_counter()
                m.forward(cache, prompt[:, :k])
                times[(v, k)].append(time.perf_counter() - t0)
                m.crop(cache, args.context)
    for k in ks:
        a, b = (statistics.median(times[(v, k)]) * 1000 for v in ("opaque", "traced"))
        results[f"{which} T({k})"] = {"opaque_ms": round(a, 2), "traced_ms": round(b, 2), "traced/opaque": round(b / a, 3)}
        print(f"{which} T({k}) at c = {args.context}: opaque {a:.2f} ms, traced {b:.2f} ms, ratio {b / a:.3f}", flush=True)
print(json.dumps(results))
