import json, sys, time
import multispec.drafting.shape as shape
from multispec.api import generate, load_pair
from multispec.bench import load_prompts
orig_init = shape.AutoTree.__init__
mode = {"chain": True}
def init(self, *a, **k):
    if not mode["chain"]:
        k["chain"] = None
    orig_init(self, *a, **k)
shape.AutoTree.__init__ = init
pair = load_pair(compile=True)
prompts = load_prompts(["mt-bench"], None, None, spread=True)[:10] + load_prompts(["spec-bench-dev"], None, None, spread=True)[:10]
labels = ["auto-chain", "auto-tree-only", "sd1"]
for t in (0.0, 1.0):
    for lab in labels:  # warm-up
        mode["chain"] = lab != "auto-tree-only"
        m = ("sd", {"gamma": 1}) if lab == "sd1" else ("mcsd", {"tree": "auto"})
        generate(pair.target, pair.draft, prompts[0].text, method=m[0], max_new_tokens=8, temperature=t, seed=0, **m[1])
    tot = {l: [0, 0.0, 0, 0.0] for l in labels}
    for i, p in enumerate(prompts):
        for lab in (labels if i % 2 == 0 else labels[::-1]):
            mode["chain"] = lab != "auto-tree-only"
            m = ("sd", {"gamma": 1}) if lab == "sd1" else ("mcsd", {"tree": "auto"})
            st = generate(pair.target, pair.draft, p.text, method=m[0], max_new_tokens=128, temperature=t, seed=i, score=False, **m[1]).stats
            tot[lab][0] += st["new_tokens"]; tot[lab][1] += st["seconds"]; tot[lab][2] += st["target_calls"]; tot[lab][3] += st["other_seconds"]
    for lab in labels:
        n, s, c, o = tot[lab]
        print(f"T={t:g} {lab:15s} {n/s:7.1f} tok/s  block eff {n/c:.2f}  other {o/c*1000:.2f} ms/call", flush=True)
