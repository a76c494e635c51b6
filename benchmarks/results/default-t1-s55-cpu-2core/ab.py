"""gamma=auto with and without pricing an iteration's work besides forwards, beside `ar`, in one process.

    python ab.py [--prompts 20] [--tokens 128] [--out ab.jsonl]

The default method (`sd:gamma=auto,drafter=hybrid`) prices a drafting iteration's other work at
`OVERHEAD_PRIOR` and a plain step's at `PLAIN_OVERHEAD_PRIOR` ("new"); "old" sets both to 0, as before. Each
prompt runs ar, old and new twice, in an order that alternates between prompts; T = 0 and 1, the same seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ORDERS = (("ar", "old", "new", "new", "old", "ar"), ("new", "old", "ar", "ar", "old", "new"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", default="ab.jsonl")
    args = ap.parse_args()
    import multispec.decoding.sd as sd
    from multispec.api import generate, load_pair

    priced = (sd.OVERHEAD_PRIOR, sd.PLAIN_OVERHEAD_PRIOR)
    here = Path(__file__).parent
    rows = [json.loads(line) for line in (here.parent / "engine-bench-s54-cpu-2core" / "prompts.jsonl").open()]
    prompts = rows[:: max(1, len(rows) // args.prompts)][: args.prompts]
    pair = load_pair(compile=True)

    def run(prompt, arm, temperature):
        sd.OVERHEAD_PRIOR, sd.PLAIN_OVERHEAD_PRIOR = priced if arm == "new" else (0.0, 0.0)
        method, params = ("ar", {}) if arm == "ar" else ("sd", {"gamma": "auto", "drafter": "hybrid"})
        t0 = time.perf_counter()
        r = generate(pair.target, pair.draft, prompt["prompt"], method=method, max_new_tokens=args.tokens,
                     temperature=temperature, seed=1, score=False, **params)
        return time.perf_counter() - t0, r

    for arm in ("ar", "old", "new"):
        for temperature in (0.0, 1.0):
            run(prompts[0], arm, temperature)
    with open(here / args.out, "w") as out:
        for i, prompt in enumerate(prompts):
            for temperature in (0.0, 1.0):
                got: dict[str, list] = {}
                for arm in ORDERS[i % 2]:
                    seconds, r = run(prompt, arm, temperature)
                    got.setdefault(arm, []).append((seconds, len(r.token_ids), r.stats.get("drafter_iterations")))
                row = {"prompt": prompt["id"], "category": prompt["category"], "temperature": temperature,
                       **{f"{arm}_tokens_per_second": sum(n for _, n, _ in g) / sum(t for t, _, _ in g)
                          for arm, g in got.items()},
                       **{f"{arm}_drafter_iterations": g[0][2] for arm, g in got.items() if arm != "ar"}}
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(f"{prompt['id']} T={temperature:g}: old/ar {row['old_tokens_per_second'] / row['ar_tokens_per_second']:.3f}"
                      f", new/ar {row['new_tokens_per_second'] / row['ar_tokens_per_second']:.3f}; "
                      f"old {row['old_drafter_iterations']}, new {row['new_drafter_iterations']}", flush=True)
    rows = [json.loads(line) for line in (here / args.out).open()]
    print("\nmedian over prompts (old/ar, new/ar, new/old):")
    for temperature in (0.0, 1.0):
        sel = [r for r in rows if r["temperature"] == temperature]
        ratios = [statistics.median(r[f"{a}_tokens_per_second"] / r[f"{b}_tokens_per_second"] for r in sel)
                  for a, b in (("old", "ar"), ("new", "ar"), ("new", "old"))]
        print(f"  T={temperature:g}: " + ", ".join(f"{x:.3f}" for x in ratios))


if __name__ == "__main__":
    main()
