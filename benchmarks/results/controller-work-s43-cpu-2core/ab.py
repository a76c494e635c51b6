import json, sys, hashlib
from multispec.api import generate, load_pair
from multispec.bench.prompts import load_prompts
pair = load_pair(compile=True)
prompts = load_prompts(["spec-bench-dev"], limit=6, spread=True)
texts = [p.text for p in prompts]
methods = [("sd", {"gamma": "auto", "drafter": "hybrid"}), ("mcsd", {"tree": "auto"})]
generate(pair.target, pair.draft, "Hello there, how are you?", method="sd", gamma="auto", drafter="hybrid", max_new_tokens=16, temperature=0)
for T in (0.0, 1.0):
  for m, p in methods:
    other = calls = tok = 0; h = hashlib.sha1()
    for t in texts:
        r = generate(pair.target, pair.draft, t, method=m, max_new_tokens=128, temperature=T, seed=0, score=False, **p)
        other += r.stats["other_seconds"]; calls += r.stats["target_calls"]; tok += len(r.token_ids)
        h.update(str(r.token_ids).encode())
    print(f"T={T} {m} {p}: tokens {tok} calls {calls} other {1e3*other/calls:.3f} ms/call hash {h.hexdigest()[:12]}", flush=True)
