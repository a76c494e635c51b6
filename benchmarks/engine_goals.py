"""The engine's speed goals read off a `multispec bench` results.jsonl (`ar` at least 2x `hf`; the default at
least 1.5x `hf` and 1x `hf-lookup`, `hf-assisted` and llama.cpp; the seeds' methods at least level with `sd` or
`ar`): paired per-prompt speed ratios by category and temperature, the seeds' claims in direction, and where
the time of each method went.

    python benchmarks/engine_goals.py benchmarks/results/engine-bench/bench/results.jsonl

Ratios are medians over prompts of (tokens/s of a / tokens/s of b) on the same prompt and temperature;
"all" pools the categories. A comparison whose method is missing prints "–".
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

DEFAULT = "sd:gamma=auto,drafter=hybrid"
# the best of a family: every method in the results named so, or so with parameters (a gamma=auto sd is the
# default, not a fixed chain)
SD = ("sd:gamma=1", "sd:gamma=2", "sd:gamma=3", "sd:gamma=4")
MCSD = ("mcsd", "specinfer")
BEAMS = ("beam:width=2", "beam:width=3")

# (label, a, b or a tuple of b: the best of them per category by median tokens/s, goal)
COMPARISONS = [
    ("ar / hf", "ar", "hf", 2.0),
    ("ar / hf-static", "ar", "hf-static", 1.0),
    ("default / hf", DEFAULT, "hf", 1.5),
    ("default / hf-static", DEFAULT, "hf-static", 1.3),
    ("default / hf-lookup", DEFAULT, "hf-lookup", 1.0),
    ("default / hf-assisted", DEFAULT, "hf-assisted", 1.0),
    ("default / llama-cpp", DEFAULT, "llama-cpp", 1.0),
    ("ar / llama-cpp", "ar", "llama-cpp", None),
    ("best mcsd / best sd", MCSD, SD, 1.0),
    ("mjsd / ar", "mjsd", "ar", 1.0),
    ("mtad / best sd", "mtad", SD, 1.0),
]


def load(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if not r.get("error") and r.get("tokens_per_second")]


def median(xs):
    return statistics.median(xs) if xs else None


def best(methods, speeds: dict, cat_prompts) -> str | None:
    """The method among `methods` (for a name without parameters, also that method with any) with the highest
    median tokens/s over these prompts."""
    present = {m for _, m in speeds}
    methods = {m for m in present for name in methods if m == name or (":" not in name and m.startswith(name + ":"))}
    scored = [(median([speeds[(p, m)] for p in cat_prompts if (p, m) in speeds]) or 0, m) for m in sorted(methods)]
    scored = [s for s in scored if s[0] > 0]
    return max(scored)[1] if scored else None


def ratio(a, b, speeds, prompts) -> tuple[float | None, str]:
    a = best(a, speeds, prompts) if isinstance(a, tuple) else a
    b = best(b, speeds, prompts) if isinstance(b, tuple) else b
    values = [speeds[(p, a)] / speeds[(p, b)] for p in prompts if (p, a) in speeds and (p, b) in speeds]
    return median(values), f"{a} / {b}"


def fmt(x, goal=None):
    if x is None:
        return "–"
    mark = "" if goal is None else (" ✓" if x >= goal else " ✗")
    return f"{x:.2f}{mark}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    args = ap.parse_args()
    rows = load(args.results)
    for t in sorted({r["temperature"] for r in rows}):
        here = [r for r in rows if r["temperature"] == t]
        speeds = {(r["prompt_id"], r["method"]): r["tokens_per_second"] for r in here}
        by_cat = defaultdict(set)
        for r in here:
            by_cat[r["category"]].add(r["prompt_id"])
        cats = sorted(by_cat) + ["all"]
        by_cat["all"] = {p for ps in list(by_cat.values()) for p in ps}
        print(f"\n## T = {t:g}: median per-prompt speed ratio (goal: ✓ met, ✗ missed)\n")
        print("| comparison | goal | " + " | ".join(f"{c} (n={len(by_cat[c])})" for c in cats) + " |")
        print("|---|---|" + "---|" * len(cats))
        for label, a, b, goal in COMPARISONS:
            cells = [fmt(ratio(a, b, speeds, by_cat[c])[0], goal) for c in cats]
            print(f"| {label} | {'–' if goal is None else f'≥ {goal:g}'} | " + " | ".join(cells) + " |")
        which = {c: (best(MCSD, speeds, by_cat[c]), best(SD, speeds, by_cat[c])) for c in cats}
        print("\nbest mcsd / best sd by category: " + "; ".join(f"{c}: {m} / {s}" for c, (m, s) in which.items()))
        if any(r["method"] == "dsbd" for r in here):
            ppl = {
                m: median([r["perplexity"] for r in here if r["method"] == m and r["perplexity"]])
                for m in ("dsbd", *BEAMS)
            }
            print(
                f"\ndsbd against beam (median perplexity, dsbd {fmt(ppl['dsbd'])}; speed ratio over all prompts): "
                + "; ".join(
                    f"{m}: PPL {fmt(ppl[m])}, dsbd / {m} {fmt(ratio('dsbd', m, speeds, by_cat['all'])[0])}"
                    for m in BEAMS
                )
            )
        print("\nmedian tokens/s (all prompts) and time per target call, ms: target forward / draft forwards / other")
        print("\n| method | tokens/s | block eff. | target | draft | other |\n|---|---|---|---|---|---|")
        for m in dict.fromkeys(r["method"] for r in here):
            mine = [r for r in here if r["method"] == m]
            split = ["–"] * 3
            if mine[0].get("target_seconds") is not None:
                split = [
                    f"{1000 * median([r[k] / r['target_calls'] for r in mine]):.1f}"
                    for k in ("target_seconds", "draft_seconds", "other_seconds")
                ]
            be = median([r["block_efficiency"] for r in mine if r.get("block_efficiency")])
            print(
                f"| {m} | {median([r['tokens_per_second'] for r in mine]):.1f} | {fmt(be)} | "
                + " | ".join(split)
                + " |"
            )


if __name__ == "__main__":
    main()
