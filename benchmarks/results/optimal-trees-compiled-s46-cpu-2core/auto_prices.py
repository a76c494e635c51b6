"""tree=auto as tune offers it (work A/B/A: a plain step's and a chain's work taken as a tree iteration's, no
forward factors) against tree=auto given every price tune measured (A/B/C/D/E and the factors P/C/T/CD/TD), with
`sd` gamma 1 in the same loop, on the held-out halves of the protocol's combos: prompt by prompt, every variant on
each, the protocol's seeds (the prompt's index).

    python benchmarks/results/optimal-trees-compiled-s46-cpu-2core/auto_prices.py [--only mt-bench-T1 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from optimal_trees import combos  # noqa: E402


def full_prices(evidence: dict, offered: str) -> str:
    """The offered tree=auto spec with every measured price: overhead A/B/C/D/E (ms) and factors."""
    params = dict(item.split("=", 1) for item in offered.split(":", 1)[1].split(","))
    work = evidence["overhead_seconds"]
    chain = evidence["probe"]["chain_overhead_seconds"]
    f = evidence["probe"]["forward_factors"]
    params["overhead"] = "/".join(f"{x * 1000:.4f}" for x in (work["per_iteration"], work["per_node"],
                                                                work["ar_per_step"], chain[0], chain[1]))
    params["factors"] = "/".join(f"{x:.4f}" for x in (f["ar"], f["chain"][0], f["tree"][0], f["chain"][1],
                                                        f["tree"][1]))
    return "mcsd:" + ",".join(f"{k}={v}" for k, v in params.items())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="+", default=None)
    ap.add_argument("--per-half", type=int, default=10)
    args = ap.parse_args()
    from multispec.api import generate, load_pair
    from multispec.bench import load_prompts

    pair = load_pair(compile=True)
    rows_path = HERE / "auto_prices.jsonl"
    for prompt_set, category, t in combos([0.0, 1.0]):
        combo = f"{category or prompt_set}-T{t:g}"
        if args.only and not any(combo.startswith(o) for o in args.only):
            continue
        evidence = json.loads((HERE / combo / "plan.json").read_text())["evidence"]
        offered = next(c["plan"] for c in evidence["candidates"] if c["plan"].startswith("mcsd:tree=auto"))
        variants = {"sd:gamma=1": "sd:gamma=1,drafter=model", "auto-offered": offered,
                    "auto-full-prices": full_prices(evidence, offered)}
        print(f"[{combo}] {variants['auto-full-prices']}", file=sys.stderr)
        prompts = load_prompts([prompt_set], [category] if category else None, None, spread=category is None)
        held_out = prompts[args.per_half: 2 * args.per_half]
        for i, p in enumerate(held_out):
            for label, spec in variants.items():
                st = generate(pair.target, pair.draft, p.text, method=spec, max_new_tokens=128, temperature=t,
                              seed=i, score=False).stats
                row = {"combo": combo, "variant": label, "prompt": p.id, "new_tokens": st["new_tokens"],
                       "seconds": st["seconds"], "target_calls": st["target_calls"],
                       "trees_used": st.get("trees_used")}
                with rows_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
        rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
        for label in variants:
            rs = [r for r in rows if r["combo"] == combo and r["variant"] == label]
            tps = sum(r["new_tokens"] for r in rs) / sum(r["seconds"] for r in rs)
            be = sum(r["new_tokens"] for r in rs) / sum(r["target_calls"] for r in rs)
            print(f"[{combo}] {label}: {tps:.1f} tokens/s, block efficiency {be:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
