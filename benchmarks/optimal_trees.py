"""Optimal trees, `tree=auto` and `multispec tune` on held-out halves.

For each category and temperature: `tune` on the first N prompts of the category, then measure on the next N
(held out): transformers' generate() (hf), ar, sd with fixed gamma, mcsd with the MCSD paper's k-configs, the
optimal trees of the same node counts (the highest expected accepted tokens under the acceptance tune
measured), tree=auto with tune's prior, and the tuned plan. One row per (category, temperature, method, prompt)
is appended to rows.jsonl as it finishes (a rerun skips finished rows); `--summarise` writes summary.md from the
rows.

    python benchmarks/optimal_trees.py --out benchmarks/results/<run> [--per-half 5] [--max-new-tokens 128] [--compile]
    python benchmarks/optimal_trees.py --out benchmarks/results/<run> --summarise
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CATEGORIES = [
    ("mt-bench", None),
    ("spec-bench-dev", "translation"),
    ("spec-bench-dev", "summarization"),
    ("spec-bench-dev", "qa"),
    ("spec-bench-dev", "math_reasoning"),
    ("spec-bench-dev", "rag"),
]
SD_GAMMAS = (1, 2, 4)
K_CONFIGS = ("8x1", "4x2x2")  # 16 and 28 nodes
# tree=auto's module constants for --auto-variants: no probes while plain steps are chosen, no drafting margin
AUTO_VARIANTS = {
    "probe=0": {"PROBE_EVERY": 10**9},
    "margin=0": {"DRAFT_MARGIN": 0.0},
    "probe=0,margin=0": {"PROBE_EVERY": 10**9, "DRAFT_MARGIN": 0.0},
}


def combos(temperatures):
    for prompts, category in CATEGORIES:
        for t in temperatures:
            yield prompts, category, t


def run(args) -> None:
    import multispec.drafting.shape as shape
    from multispec.api import generate, load_pair
    from multispec.drafting.shape import AUTO_MAX_DEPTH
    from multispec.tools.bench import load_prompts
    from multispec.tools.bench.runner import hf_generate
    from multispec.tools.tune import load_plan, tune, write_plan
    from multispec.tree_search import RankAcceptance, TreeTable, reach_of, tree_value
    from multispec.trees import TokenTree
    from multispec.warp import Sampling

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.jsonl"
    done = set()
    if rows_path.exists():
        for line in rows_path.read_text().splitlines():
            r = json.loads(line)
            done.add((r["combo"], r["method"], r["prompt"]))
    pair = load_pair(compile=args.compile)
    warmed: list[bool] = []
    for prompt_set, category, t in combos(args.temperatures):
        combo = f"{category or prompt_set}-T{t:g}"
        if args.only and not any(combo.startswith(o) for o in args.only):
            continue
        prompts = load_prompts([prompt_set], [category] if category else None, None, spread=category is None)
        tune_half, held_out = prompts[: args.per_half], prompts[args.per_half : 2 * args.per_half]
        plan_path = out / combo / "plan.json"
        if not plan_path.exists():
            print(f"[{combo}] tune on {len(tune_half)} prompts", file=sys.stderr)
            result = tune(
                pair.target,
                pair.draft,
                tune_half,
                temperature=t,
                max_new_tokens=args.max_new_tokens,
                measure=3,
                say=lambda m, c=combo: print(f"[{c}] {m}", file=sys.stderr),
            )
            write_plan(result, plan_path, pair.description)
        plan = load_plan(plan_path)
        evidence = plan.data["evidence"]
        reach = reach_of(RankAcceptance.from_dict(evidence["rank_acceptance"]).rates(AUTO_MAX_DEPTH))
        table = TreeTable(reach, 64, AUTO_MAX_DEPTH)
        prior = "/".join(f"{r:.3f}" for r in RankAcceptance.from_dict(evidence["rank_acceptance"]).pooled())
        methods = {"ar": ("ar", {})}
        for g in SD_GAMMAS:
            methods[f"sd:gamma={g}"] = ("sd", {"gamma": g, "drafter": "model"})
        for k in K_CONFIGS:
            tree = TokenTree.from_branching([int(x) for x in k.split("x")])
            methods[f"mcsd:k_config={k}"] = ("mcsd", {"k_config": k, "replacement": False})
            n = tree.size
            depth = max(range(1, AUTO_MAX_DEPTH + 1), key=lambda d: table.value(n, d))
            best = table.tree(n, depth)
            (out / combo).mkdir(exist_ok=True)
            (out / combo / f"optimal-{n}.json").write_text(json.dumps({"parents": best.parents.tolist()}))
            methods[f"mcsd:optimal-{n}"] = (
                "mcsd",
                {
                    "tree": best,
                    "replacement": False,
                    "_predicted": tree_value(best, reach),
                    "_kconfig_predicted": tree_value(tree, reach),
                },
            )
        # tree=auto as tune offers it (its prior and measured per-iteration work); --adapt: the variant
        # that follows the call's clock (adapt=true)
        auto = next((c["plan"] for c in evidence["candidates"] if c["plan"].startswith("mcsd:tree=auto")), None)
        if args.adapt or auto is None:
            methods["mcsd:tree=auto"] = (
                "mcsd",
                {"tree": "auto", "acceptance": prior, "adapt": True, "replacement": False},
            )
        else:
            methods["mcsd:tree=auto"] = (auto, {})
            if args.unscaled_auto:  # the same prior, priced as an earlier tune wrote it: A/B/A (no chain line,
                # a plain step's work taken as a tree iteration's), no factors
                params = dict(item.split("=", 1) for item in auto.split(":", 1)[1].split(","))
                params.pop("factors", None)
                a, b = params["overhead"].split("/")[:2]
                params["overhead"] = f"{a}/{b}/{a}"
                methods["mcsd:tree=auto,unscaled"] = ("mcsd:" + ",".join(f"{k}={v}" for k, v in params.items()), {})
        if args.auto_variants and auto is not None:  # the controller's exploration and margin, switched off
            for name, constants in AUTO_VARIANTS.items():
                methods[f"mcsd:tree=auto,{name}"] = (auto, {"_constants": constants})
        methods["plan"] = (plan.spec, {})  # generate reads the spec's parameters
        methods["hf"] = ("hf", {})  # transformers' generate() on the target, as it ships
        if args.methods:
            methods = {k: v for k, v in methods.items() if k in args.methods}
        # prompt by prompt, every method on each: a drift of the host's speed (here +-20 % over minutes) then
        # falls on all methods alike instead of on whichever ran during it
        for i, p in enumerate(held_out):
            for label, (method, params) in methods.items():
                constants = params.get("_constants", {})
                extra = {k: v for k, v in params.items() if k.startswith("_") and k != "_constants"}
                params = {k: v for k, v in params.items() if not k.startswith("_")}
                if (combo, label, p.id) in done:
                    continue
                if method == "hf":
                    ids = pair.target.encode(p.text, chat=True)
                    if not warmed:  # lazy initialisation outside the timed rows, as the bench's warm-up does
                        hf_generate(pair.target, None, ids, 8, Sampling(t), 0)
                        warmed.append(True)
                    tokens, st = hf_generate(pair.target, None, ids, args.max_new_tokens, Sampling(t), i)
                    st = {
                        "new_tokens": len(tokens),
                        "tokens_per_second": len(tokens) / st["seconds"],
                        "block_efficiency": 1.0,
                        "iterations": st["target_calls"],
                        "target_seconds": None,
                        "draft_seconds": None,
                        "other_seconds": None,
                        **st,
                    }
                else:
                    saved = {name: getattr(shape, name) for name in constants}
                    for name, value in constants.items():
                        setattr(shape, name, value)
                    try:
                        st = generate(
                            pair.target,
                            pair.draft,
                            p.text,
                            method=method,
                            max_new_tokens=args.max_new_tokens,
                            temperature=t,
                            seed=i,
                            score=False,
                            **params,
                        ).stats
                    finally:
                        for name, value in saved.items():
                            setattr(shape, name, value)
                row = {
                    "combo": combo,
                    "method": label,
                    "prompt": p.id,
                    "new_tokens": st["new_tokens"],
                    "seconds": st["seconds"],
                    "target_calls": st["target_calls"],
                    "iterations": st["iterations"],
                    "target_seconds": st["target_seconds"],
                    "draft_seconds": st["draft_seconds"],
                    "other_seconds": st["other_seconds"],
                    "prefill_seconds": st.get("prefill_seconds"),
                    "draft_prefill_seconds": st.get("draft_prefill_seconds"),
                    "compiles": st.get("compiles"),
                    "compiled": args.compile,
                    **extra,
                }
                with rows_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(
                    f"[{combo}] {label} {p.id}: {st['tokens_per_second']:.1f} tokens/s, "
                    f"block efficiency {st['block_efficiency']:.2f}",
                    file=sys.stderr,
                )


def summarise(args) -> None:
    out = Path(args.out)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    by: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        by.setdefault((r["combo"], r["method"]), []).append(r)
    combos_seen = list(dict.fromkeys(r["combo"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))

    def tps(rs):
        return sum(r["new_tokens"] for r in rs) / sum(r["seconds"] for r in rs)

    def be(rs):
        return sum(r["new_tokens"] for r in rs) / sum(r["target_calls"] for r in rs)

    lines = [
        "## Tokens/s on the held-out half (sum of tokens / sum of seconds)",
        "",
        "| combo | " + " | ".join(methods) + " | auto / best fixed | auto / ar | plan / best fixed | plan / ar |",
        "|---" * (len(methods) + 5) + "|",
    ]
    be_lines = [
        "## Block efficiency on the held-out half (tokens per target call), optimal vs k-config of the same node count",
        "",
        "| combo | nodes | k-config | measured k-config | optimal tree | measured "
        "optimal | predicted k-config | predicted optimal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    pred_lines = [
        "## The tuned plan: predicted (on the tune half) against measured (held-out half)",
        "",
        "| combo | plan | predicted tokens/s | measured on tune half | measured held out | held out / "
        "predicted | new tokens: expected / held out | decoding only (prompt's forward apart): held out / "
        "predicted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for combo in combos_seen:
        cells, vals = [], {}
        for m in methods:
            rs = by.get((combo, m))
            vals[m] = tps(rs) if rs else None
            cells.append(f"{vals[m]:.1f}" if rs else "-")
        fixed = [v for m, v in vals.items() if v is not None and (m.startswith("sd:") or m.startswith("mcsd:k_config"))]
        best_fixed = max(fixed) if fixed else None

        def ratio(a, b):
            return f"{a / b:.2f}" if a and b else "-"

        auto = vals.get("mcsd:tree=auto")
        lines.append(
            f"| {combo} | " + " | ".join(cells) + f" | {ratio(auto, best_fixed)} | "
            f"{ratio(auto, vals.get('ar'))} | {ratio(vals.get('plan'), best_fixed)} | "
            f"{ratio(vals.get('plan'), vals.get('ar'))} |"
        )
        for m in methods:
            if not m.startswith("mcsd:optimal-"):
                continue
            n = int(m.split("-")[-1])
            k = next((k for k in K_CONFIGS if _nodes(k) == n), None)
            opt, kc = by.get((combo, m)), by.get((combo, f"mcsd:k_config={k}"))
            if opt and kc:
                be_lines.append(
                    f"| {combo} | {n} | {k} | {be(kc):.3f} | {m} | {be(opt):.3f} | "
                    f"{opt[0]['_kconfig_predicted']:.3f} | {opt[0]['_predicted']:.3f} |"
                )
        plan_file = out / combo / "plan.json"
        if plan_file.exists() and by.get((combo, "plan")):
            plan = json.loads(plan_file.read_text())
            measured = tps(by[(combo, "plan")])
            label = plan["method"] + (
                ":" + ",".join(f"{k}={v}" for k, v in plan["params"].items()) if plan["params"] else ""
            )
            rs = by[(combo, "plan")]
            row = plan["evidence"].get("chosen")  # absent from older plans
            lengths = decoding = "-"
            if row is not None:  # its rows hold the draft's prompt forward too
                new = sum(r["new_tokens"] for r in rs)
                lengths = f"{row['expected_new_tokens']:.0f} / {new / len(rs):.0f}"
                seconds = sum(r["seconds"] - r["prefill_seconds"] - (r["draft_prefill_seconds"] or 0.0) for r in rs)
                predicted = row["predicted_tokens_per_call"] / row["predicted_seconds_per_iteration"]
                decoding = f"{new / seconds / predicted:.2f}"
            pred_lines.append(
                f"| {combo} | {label[:60]} | {plan['predicted_tokens_per_second']:.1f} | "
                f"{plan['measured_tokens_per_second']:.1f} | {measured:.1f} | "
                f"{measured / plan['predicted_tokens_per_second']:.2f} | {lengths} | {decoding} |"
            )
    split = [
        "## Where the time goes (every combo pooled, per target call; the prompt's forward apart)",
        "",
        "| method | block efficiency | target ms/call | draft ms/call | other ms/call | prefill ms/prompt |",
        "|---|---|---|---|---|---|",
    ]
    for m in methods:
        rs = [r for r in rows if r["method"] == m and r.get("target_seconds") is not None]
        if not rs or any(r.get("prefill_seconds") is None for r in rs):
            continue
        calls = sum(r["target_calls"] for r in rs)
        prefill = sum(r["prefill_seconds"] for r in rs)
        split.append(
            f"| {m} | {be(rs):.2f} | "
            f"{(sum(r['target_seconds'] for r in rs) - prefill) / max(1, calls - len(rs)) * 1e3:.1f} | "
            f"{sum(r['draft_seconds'] for r in rs) / calls * 1e3:.1f} | "
            f"{sum(r['other_seconds'] for r in rs) / calls * 1e3:.1f} | {prefill / len(rs) * 1e3:.0f} |"
        )
    text = "\n".join(lines + [""] + be_lines + [""] + pred_lines + [""] + split) + "\n"
    (out / "summary.md").write_text(text)
    print(text)


def _nodes(k: str) -> int:
    width, total = 1, 0
    for x in k.split("x"):
        width *= int(x)
        total += width
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--per-half", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--only", nargs="+", default=None, help="only the combos whose names start so (e.g. qa-T0)")
    p.add_argument("--compile", action="store_true", help="compiled forwards for our methods (hf stays as it ships)")
    p.add_argument("--adapt", action="store_true", help="tree=auto follows the call's clock (adapt=true)")
    p.add_argument("--methods", nargs="+", default=None, help="only these rows' labels (e.g. ar sd:gamma=1 plan)")
    p.add_argument(
        "--unscaled-auto",
        action="store_true",
        help="also tree=auto priced as an older tune wrote it: overhead A/B/A (a plain step's and a "
        "chain's work = a tree iteration's), no factors",
    )
    p.add_argument(
        "--auto-variants",
        action="store_true",
        help="also tune's tree=auto without its probes, without its drafting margin, and without both",
    )
    p.add_argument("--summarise", action="store_true")
    args = p.parse_args()
    summarise(args) if args.summarise else run(args)


if __name__ == "__main__":
    main()
