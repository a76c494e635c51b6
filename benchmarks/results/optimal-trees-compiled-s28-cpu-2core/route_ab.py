"""The bucket route on and off, in one process: the compiled default pair's cost curves are measured here (which
times every bucket's graph and routes a bucket to a larger one that ran faster), then `sd` chains run on the same
prompts with the route and with it cleared, interleaved per prompt. Tokens/s (sum over sum) and target ms per
call; the same tokens either way at T = 0 in float32, here bf16 (padding rows are masked out and dropped).

    python benchmarks/results/optimal-trees-compiled-s28-cpu-2core/route_ab.py [--prompts 6] [--gammas 2 3]
"""

import argparse
import json

from multispec.api import generate, load_pair
from multispec.bench import load_prompts
from multispec.models.cost import forward_cost

ap = argparse.ArgumentParser()
ap.add_argument("--prompts", type=int, default=6)
ap.add_argument("--gammas", type=int, nargs="+", default=[2, 3])
ap.add_argument("--max-new-tokens", type=int, default=128)
args = ap.parse_args()
pair = load_pair(compile=True)
for m in (pair.target, pair.draft):
    forward_cost(m, here=True)
routes = {"target": dict(pair.target.bucket_route), "draft": dict(pair.draft.bucket_route)}
print("routes:", routes, flush=True)
# the qa category's held-out half (nothing is tuned here)
prompts = load_prompts(["spec-bench-dev"], ["qa"], None)[10 : 10 + args.prompts]
totals = {}
for p in prompts:
    for g in args.gammas:
        for on in (True, False):
            for m in (pair.target, pair.draft):
                m.bucket_route.clear()
            if on:
                pair.target.bucket_route.update(routes["target"])
                pair.draft.bucket_route.update(routes["draft"])
            st = generate(pair.target, pair.draft, p.text, method="sd", gamma=g, drafter="model",
                          max_new_tokens=args.max_new_tokens, temperature=0, score=False).stats
            t = totals.setdefault((g, on), {"tokens": 0, "seconds": 0.0, "target": 0.0, "calls": 0})
            t["tokens"] += st["new_tokens"]
            t["seconds"] += st["seconds"]
            t["target"] += st["target_seconds"] - st["prefill_seconds"]
            t["calls"] += st["target_calls"] - 1
out = {"routes": {k: {str(b): x for b, x in v.items()} for k, v in routes.items()}, "rows": []}
for g in args.gammas:
    on, off = totals[(g, True)], totals[(g, False)]
    row = {"method": f"sd:gamma={g}", "route_tokens_per_second": round(on["tokens"] / on["seconds"], 2),
           "no_route_tokens_per_second": round(off["tokens"] / off["seconds"], 2),
           "route_target_ms_per_call": round(on["target"] / on["calls"] * 1e3, 2),
           "no_route_target_ms_per_call": round(off["target"] / off["calls"] * 1e3, 2)}
    row["speed_ratio"] = round(row["route_tokens_per_second"] / row["no_route_tokens_per_second"], 3)
    out["rows"].append(row)
    print(row, flush=True)
print(json.dumps(out))
