"""MTAD at T = 1 with its sampled beams drawn by rows (`warp.draws_by_rows`) against the draw over all
beams x vocabulary flattened (the former path), prompt by prompt in one process, 10 MT-Bench prompts (spread,
10-19), 128 tokens, the compiled shipped pair.

    python benchmarks/results/beam-draws-s46-cpu-2core/mtad_ab.py
"""
import statistics, torch, hashlib
import multispec.drafting.beams as beams
from multispec.api import generate, load_pair
from multispec.bench import load_prompts
pair = load_pair(compile=True)
prompts = load_prompts(["mt-bench"], None, None, spread=True)[10:20]
by_rows = beams.draws_by_rows
def flat(row, mass, k, gen):
    return beams.sequential_draws((row * mass[:, None]).reshape(1, -1), k, gen)[0][0]
generate(pair.target, pair.draft, prompts[0].text, method="mtad", max_new_tokens=32, temperature=1.0, seed=0, score=False)
res = {"by-rows": [], "flat": []}
for i, p in enumerate(prompts):
    for name, f in (("by-rows", by_rows), ("flat", flat)):
        beams.draws_by_rows = f
        out = generate(pair.target, pair.draft, p.text, method="mtad", max_new_tokens=128, temperature=1.0, seed=i, score=False)
        res[name].append((out.stats, hashlib.md5(str(out.token_ids).encode()).hexdigest()[:8]))
for name, rs in res.items():
    st = [s for s, _ in rs]
    calls = sum(s["target_calls"] for s in st)
    print(name, "tok/s %.1f" % (sum(s["new_tokens"] for s in st) / sum(s["seconds"] for s in st)),
          "BE %.2f" % (sum(s["new_tokens"] for s in st) / calls),
          "ms/call target %.1f draft %.1f other %.2f" % tuple(1000 * sum(s[k] for s in st) / calls for k in ("target_seconds", "draft_seconds", "other_seconds")))
print("same tokens:", [a[1] == b[1] for a, b in zip(res["by-rows"], res["flat"])])
