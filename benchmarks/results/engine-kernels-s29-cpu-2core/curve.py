"""Session 29: the default pair compiled, each model's cost curve measured in this process (which makes the
per-shape kernel choices on first use); prints and writes curve.json. Run as `python curve.py` (stderr: curve.log)."""
import json
import time

from multispec.api import load_pair
from multispec.models.cost import forward_cost

pair = load_pair(compile=True)
out = {}
for role, m in (("target", pair.target), ("draft", pair.draft)):
    t0 = time.time()
    c = forward_cost(m, here=True)
    out[role] = {"tokens": c.tokens, "contexts": c.contexts, "ms": [[round(1e3 * x, 2) for x in r] for r in c.seconds],
                 "kernels": {f"{a}x{b}": k for (a, b), k in m.kernels.items()}, "route": m.bucket_route,
                 "one_time_s": round(time.time() - t0)}
    print(role, json.dumps(out[role]), flush=True)
json.dump(out, open("curve.json", "w"), indent=1)
