"""MTAD at T = 1 with its sampled beams drawn by rows (`warp.draws_by_rows`) against the draw over all
beams x vocabulary flattened (the former path), prompt by prompt in one process, 10 MT-Bench prompts (spread,
10-19), 128 tokens, the compiled shipped pair.

    python benchmarks/results/beam-draws-s46-cpu-2core/mtad_ab.py
"""

import hashlib

import multispec.drafting.beams as beams
from multispec.api import generate, load_pair
from multispec.bench import load_prompts


def flat(row, mass, k, gen):
    return beams.sequential_draws((row * mass[:, None]).reshape(1, -1), k, gen)[0][0]


def main() -> None:
    pair = load_pair(compile=True)
    prompts = load_prompts(["mt-bench"], None, None, spread=True)[10:20]
    draws = {"by-rows": beams.draws_by_rows, "flat": flat}
    generate(pair.target, pair.draft, prompts[0].text, method="mtad", max_new_tokens=32, temperature=1.0, seed=0,
             score=False)
    res = {name: [] for name in draws}
    for i, p in enumerate(prompts):
        for name, f in draws.items():
            beams.draws_by_rows = f
            out = generate(pair.target, pair.draft, p.text, method="mtad", max_new_tokens=128, temperature=1.0,
                           seed=i, score=False)
            res[name].append((out.stats, hashlib.md5(str(out.token_ids).encode()).hexdigest()[:8]))
    for name, rs in res.items():
        st = [s for s, _ in rs]
        calls = sum(s["target_calls"] for s in st)
        ms = [1000 * sum(s[k] for s in st) / calls for k in ("target_seconds", "draft_seconds", "other_seconds")]
        print(f"{name} tok/s {sum(s['new_tokens'] for s in st) / sum(s['seconds'] for s in st):.1f} "
              f"BE {sum(s['new_tokens'] for s in st) / calls:.2f} "
              f"ms/call target {ms[0]:.1f} draft {ms[1]:.1f} other {ms[2]:.2f}")
    print("same tokens:", [a[1] == b[1] for a, b in zip(res["by-rows"], res["flat"], strict=True)])


if __name__ == "__main__":
    main()
