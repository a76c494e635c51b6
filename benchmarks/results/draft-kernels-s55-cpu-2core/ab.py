"""The draft's compiled steps with and without the batch-invariant variant in their kernel race, in one process.

    python ab.py [--prompts N] [--tokens 64] [--out ab.jsonl]

Loads the default pair compiled, warms every method up (the first use of a shape races its kernels, now with
`hf.INVARIANT_DPBF16` among them), then runs each prompt and method twice, interleaved in ABBA order: once with
the draft's kernels as raced ("new"), once with each shape on the fastest of the other variants the same race
timed ("old": what a race without the variant keeps, bar a concatenated form it did not try once it lost).
Greedy and sampled (T = 0, 1), the same seed in both settings. Greedy outputs are the target's (its steps are
batch-invariant), so both arms give the same tokens; sampled ones may part where the two steps' draft logits differ
in their last bits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

METHODS = [("sd", {"gamma": 4}), ("sd", {"gamma": "auto", "drafter": "hybrid"}), ("mcsd", {"k_config": "2x1"}),
           ("specinfer", {}), ("mjsd", {}), ("mtad", {})]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default="ab.jsonl")
    args = ap.parse_args()
    from multispec.api import generate, load_pair
    from multispec.models import hf

    here = Path(__file__).parent
    rows = [json.loads(line) for line in (here.parent / "engine-bench-s54-cpu-2core" / "prompts.jsonl").open()]
    prompts = rows[:: max(1, len(rows) // args.prompts)][: args.prompts]
    pair = load_pair(compile=True)
    draft = pair.draft

    def run(prompt, method, params, temperature):
        t0 = time.perf_counter()
        r = generate(pair.target, draft, prompt["prompt"], method=method, max_new_tokens=args.tokens,
                     temperature=temperature, seed=1, score=False, **params)
        return time.perf_counter() - t0, r

    for method, params in METHODS:  # warm-up: every shape raced and compiled
        for temperature in (0.0, 1.0):
            run(prompts[0], method, params, temperature)
    store = json.loads(hf._kernel_store().read_text())[hf._kernel_key(draft)]
    new = dict(draft.kernels)
    old = {}
    for shape in new:
        timed = store[f"{shape[0]}x{shape[1]}"]["step_ms"]
        old[shape] = min((k for k in timed if k != hf.INVARIANT_DPBF16), key=timed.get)
    print("draft shapes, step ms by variant:", flush=True)
    for shape in sorted(new):
        timed = store[f"{shape[0]}x{shape[1]}"]["step_ms"]
        print(f"  {shape}: new {new[shape]}, old {old[shape]}; " + ", ".join(f"{k} {v:.3f}" for k, v in timed.items()),
              flush=True)
    settings = {"new": new, "old": old}
    for name in ("old", "new"):  # the old setting's packages (removed by the race) compiled again, off the clock
        draft.kernels = dict(settings[name])
        for method, params in METHODS:
            run(prompts[0], method, params, 1.0)
    out = open(here / args.out, "w")
    for i, prompt in enumerate(prompts):
        for method, params in METHODS:
            for temperature in (0.0, 1.0):
                got = {}
                for name in (("new", "old", "old", "new") if i % 2 else ("old", "new", "new", "old")):
                    draft.kernels = dict(settings[name])
                    seconds, r = run(prompt, method, params, temperature)
                    got.setdefault(name, []).append((seconds, r.stats["draft_seconds"], r.stats["target_seconds"],
                                                     r.token_ids))
                same = all(g[0][3] == g[1][3] for g in got.values()) and got["new"][0][3] == got["old"][0][3]
                row = {"prompt": prompt["id"], "category": prompt["category"], "method": method, **params,
                       "temperature": temperature, "same_tokens": same,
                       **{f"{name}_{what}": sum(g[j] for g in got[name]) / 2
                          for name in got for j, what in enumerate(("seconds", "draft_seconds", "target_seconds"))}}
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(f"{prompt['id']} {method} {params} T={temperature:g}: new/old time "
                      f"{row['new_seconds'] / row['old_seconds']:.3f}, draft {row['new_draft_seconds']:.3f} / "
                      f"{row['old_draft_seconds']:.3f} s, same tokens {same}", flush=True)
    out.close()
    rows = [json.loads(line) for line in (here / args.out).open()]
    print("\nmedian new/old over prompts (time, draft time):")
    for method, params in METHODS:
        for temperature in (0.0, 1.0):
            sel = [r for r in rows if r["method"] == method and r["temperature"] == temperature
                   and all(r.get(k) == v for k, v in params.items())]
            print(f"  {method} {params} T={temperature:g}: "
                  f"{statistics.median(r['new_seconds'] / r['old_seconds'] for r in sel):.3f}, "
                  f"{statistics.median(r['new_draft_seconds'] / r['old_draft_seconds'] for r in sel):.3f}")


if __name__ == "__main__":
    main()
