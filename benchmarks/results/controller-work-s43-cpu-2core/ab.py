"""Other work per target call of the default method and `mcsd:tree=auto`, with a hash of the tokens (run once
before and once after a change to compare)."""

import hashlib

from multispec.api import generate, load_pair
from multispec.bench.prompts import load_prompts

pair = load_pair(compile=True)
texts = [p.text for p in load_prompts(["spec-bench-dev"], limit=6, spread=True)]
methods = [("sd", {"gamma": "auto", "drafter": "hybrid"}), ("mcsd", {"tree": "auto"})]
generate(pair.target, pair.draft, "Hello there, how are you?", method="sd", gamma="auto", drafter="hybrid",
         max_new_tokens=16, temperature=0)
for temperature in (0.0, 1.0):
    for method, params in methods:
        other = calls = tokens = 0
        digest = hashlib.sha1()
        for text in texts:
            r = generate(pair.target, pair.draft, text, method=method, max_new_tokens=128, temperature=temperature,
                         seed=0, score=False, **params)
            other += r.stats["other_seconds"]
            calls += r.stats["target_calls"]
            tokens += len(r.token_ids)
            digest.update(str(r.token_ids).encode())
        print(f"T={temperature} {method} {params}: tokens {tokens} calls {calls} other {1e3 * other / calls:.3f} "
              f"ms/call hash {digest.hexdigest()[:12]}", flush=True)
