"""claims.json, REPORT.md and the figures of a reproduction report."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import numpy as np

from .claims import EXPERIMENTS, Context
from .stats import LEVEL, RESAMPLES

PROJECTION_FORMULA = (
    "projected tokens/s = Σ new tokens / Σ over generations [Σ over target forwards T_target(k, c) "
    "+ Σ over draft forwards T_draft(k, c) + the rest of the time as measured here]"
)


def write(out: Path, data: dict, ctx: Context, curves: dict | None) -> dict:
    data["meta"]["host"] = platform.node()
    figures = [p.name for p in plot(out, data, ctx)]
    if curves is not None:
        data["projection"] = projection(ctx, curves)
    tmp = out / "claims.json.tmp"
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, out / "claims.json")
    (out / "REPORT.md").write_text(markdown(data, figures), encoding="utf-8")
    return data


def _num(x, d=2) -> str:
    return "–" if x is None or not np.isfinite(x) else f"{x:.{d}f}"


def ours(row: dict) -> str:
    if row["value"] is None:
        return "–"
    lo, hi = row["interval"]
    d = 3 if row["unit"] == "" else 2
    return f"{_num(row['value'], d)}{row['unit']} ({_num(lo, d)}–{_num(hi, d)})"


def verdict_table(data: dict) -> list[str]:
    lines = [
        "| claim | paper: setting | paper | ours: setting | ours (95 % CI) | n | verdict | measured cause |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["claims"]:
        setting = f"[{r['experiment']}]" if r["experiment"] in EXPERIMENTS else (r["our_setting"] or "–")
        lines.append(
            f"| **{r['paper']}** `{r['id']}`: {r['claim']} | {r['paper_setting']} | {r['paper_value']} | "
            f"{setting}: {r['statistic']} | {ours(r)} | {r['n']} | **{r['verdict']}** | {r['cause']} |"
        )
    return lines


def markdown(data: dict, figures: list[str]) -> str:
    m = data["meta"]
    counts = {
        v: sum(r["verdict"] == v for r in data["claims"]) for v in ("reproduced", "direction only", "not reproduced")
    }
    pair = " / ".join(f"{k}: {m['models'].get(v, v)}" for k, v in (("target", m["target"]), ("draft", m["draft"])))
    lines = [
        "# multispec reproduce: the seed papers' claims on one model pair",
        "",
        f"- models: {pair}",
        f"- device: {m['device']}"
        + (
            " — **no GPU here**: speeds are this CPU's; block efficiency and acceptance "
            "carry across devices for the same models, speed does not"
            if not m["device"].startswith("cuda")
            else ""
        ),
        f"- host {m['host']}, {m['date']}; "
        + ("--quick (few prompts, short outputs: wide intervals)" if m["quick"] else "full run"),
        f"- energy: {m['meter'] or 'unavailable (no readable energy counter); the energy claims are not measured'}",
        *([f"- command: `{m['command']}`"] if m.get("command") else []),
        "",
        f"**{counts['reproduced']} reproduced, {counts['direction only']} direction only, {counts['not reproduced']} "
        f"not reproduced** of {len(data['claims'])} claims measured.",
        "",
        "## Verdicts",
        "",
        *verdict_table(data),
        "",
    ]
    if data["not_measured"]:
        lines += (
            ["Not measured here:", ""]
            + [f"- **{s['paper']}** `{s['id']}` ({s['claim']}): {s['reason']}" for s in data["not_measured"]]
            + [""]
        )
    lines += [
        "## Experiments",
        "",
        "Each is a `multispec bench` run in its own folder (results.jsonl, report.md: every generation, "
        "resumable); one prompt at a time, the same seed per prompt for every method.",
        "",
    ]
    lines += [
        f"- **[{n}]** {s}: methods {', '.join(f'`{x}`' for x in EXPERIMENTS[n].methods)}"
        for n, s in m["experiments"].items()
    ]
    lines += [
        "",
        "## How to read this",
        "",
        f"- ours: the statistic on the prompts measured, with a {LEVEL:.0%} paired bootstrap interval "
        f"({RESAMPLES} resamples of the prompts, each prompt's rows for both methods kept together; the "
        "theory rows resample simulated runs instead). n: prompts (or runs).",
        "- Ratios of speed are overall tokens/s (total new tokens / total time, prefill included); ratios "
        "of perplexity are exp(−mean over prompts of the output's mean log p under the unwarped target).",
        "- **reproduced**: the interval lies on the paper's side of no effect and reaches the paper's number "
        "(or range); a claim of equality: the interval holds it. **direction only**: the right side of no "
        "effect, but short of (or beyond) the paper's number. **not reproduced**: the interval holds no "
        "effect or lies on the other side.",
        "- The measured cause splits a speed ratio into its two factors: tokens per target call (acceptance, "
        "draft quality) and seconds per target call (the cost of drafting and verifying); the papers' pairs "
        "are a 13B target with a 68M draft on a GPU, where a draft forward costs a far smaller part of a "
        "target forward than here.",
        "",
    ]
    if "projection" in data:
        lines += projection_markdown(data["projection"])
    lines += [*[f"![{f}]({f})" for f in figures], ""]
    return "\n".join(lines)


# -- projection to another device -------------------------------------------------------------------


def projection(ctx: Context, curves: dict) -> dict:
    cost = curves["curves"]
    target_cost, draft_cost = cost["target"], cost.get("draft")
    out = {
        "file": curves["path"],
        "device": curves["data"].get("device"),
        "date": curves["data"].get("date"),
        "host": curves["data"].get("host"),
        "formula": PROJECTION_FORMULA,
        "experiments": {},
    }
    for name, rows in ctx.rows.items():
        methods = {}
        for r in rows:
            if r.get("error") or not r.get("target_forwards"):
                continue
            c = r["prompt_tokens"] + r["new_tokens"] // 2  # the mean context of the generation
            seconds = sum(n * target_cost(int(k), c) for k, n in r["target_forwards"].items())
            if r.get("draft_forwards"):
                if draft_cost is None:
                    raise ValueError(f"{curves['path']} holds no draft curve; `{r['method']}` runs the draft")
                seconds += sum(n * draft_cost(int(k), c) for k, n in r["draft_forwards"].items())
            seconds += r.get("other_seconds") or 0.0
            m = methods.setdefault(r["method"], {"tokens": 0, "seconds": 0.0, "measured_seconds": 0.0, "calls": 0})
            m["tokens"] += r["new_tokens"]
            m["seconds"] += seconds
            m["measured_seconds"] += r["seconds"]
            m["calls"] += r["target_calls"]
        base = "ar" if "ar" in methods else next(iter(methods), None)
        for m in methods.values():
            m["projected_tokens_per_second"] = m["tokens"] / m["seconds"] if m["seconds"] else None
            m["measured_tokens_per_second"] = m["tokens"] / m["measured_seconds"] if m["measured_seconds"] else None
            m["block_efficiency"] = m["tokens"] / m["calls"] if m["calls"] else None
        for m in methods.values():
            b = methods.get(base)
            m["baseline"] = base
            m["projected_speedup"] = (
                m["projected_tokens_per_second"] / b["projected_tokens_per_second"]
                if b and b["projected_tokens_per_second"]
                else None
            )
            m["measured_speedup"] = (
                m["measured_tokens_per_second"] / b["measured_tokens_per_second"]
                if b and b["measured_tokens_per_second"]
                else None
            )
        out["experiments"][name] = methods
    return out


def projection_markdown(p: dict) -> list[str]:
    lines = [
        f"## Projection to {p['device']} (not a measurement)",
        "",
        f"From `{p['file']}` (recorded {p['date']} on {p['host']} with `multispec cost-curve`). The block "
        "efficiencies and the forwards each generation ran are this report's; their cost is that device's:",
        "",
        f"    {p['formula']}",
        "",
        "with k the tokens a forward fed (rows × tokens per row) and c the generation's mean context. It assumes "
        "the same outputs, the same acceptance, and the non-forward time of this machine; it is never a "
        "measurement of that device.",
        "",
    ]
    for name, methods in p["experiments"].items():
        if not methods:
            continue
        base = next(iter(methods.values()))["baseline"]
        lines += [
            f"**[{name}]** (speed-ups against `{base}`)",
            "",
            "| method | block efficiency | tokens/s here | speed-up here | projected tokens/s | projected speed-up |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {n} | {_num(m['block_efficiency'])} | {_num(m['measured_tokens_per_second'], 1)} | "
            f"{_num(m['measured_speedup'])} | {_num(m['projected_tokens_per_second'], 1)} | "
            f"{_num(m['projected_speedup'])} |"
            for n, m in methods.items()
        ]
        lines.append("")
    return lines


# -- figures ----------------------------------------------------------------------------------------


def plot(out: Path, data: dict, ctx: Context) -> list[Path]:
    from matplotlib.figure import Figure

    paths = []
    ratios = [
        r
        for r in data["claims"]
        if r["unit"] == "×" and r["value"] is not None and np.isfinite(r["interval"]).all() and min(r["interval"]) > 0
    ]
    if ratios:
        fig = Figure(figsize=(8, 0.38 * len(ratios) + 1.4), layout="constrained")
        ax = fig.subplots()
        colour = {"reproduced": "C2", "direction only": "C1", "not reproduced": "C3"}
        for i, r in enumerate(reversed(ratios)):
            lo, hi = r["interval"]
            ax.plot([lo, hi], [i, i], color=colour[r["verdict"]], lw=2)
            ax.plot(r["value"], i, "o", color=colour[r["verdict"]])
            if r["expected"]:
                e0, e1 = r["expected"]
                ax.plot(
                    [e0, e1] if e1 > e0 else [e0], [i] * (2 if e1 > e0 else 1), "kx-" if e1 > e0 else "kx", ms=7, lw=1
                )
        ax.axvline(1.0, color="grey", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yticks(range(len(ratios)), [r["id"] for r in reversed(ratios)], fontsize=8)
        ax.set_xlabel(
            "ratio (log scale): ours, 95 % interval (green reproduced, orange direction only, red not); x: the paper",
            fontsize=8,
        )
        paths.append(out / "claims.png")
        fig.savefig(paths[-1], dpi=110)

    joint = ctx.rows.get("joint", [])
    sweep = sorted({r["method"] for r in joint if r["method"].startswith("mtad")})
    if sweep:
        fig = Figure(figsize=(6.5, 4.4), layout="constrained")
        ax = fig.subplots()
        for name in dict.fromkeys([*sweep, "ar", "sd:gamma=4", "mjsd", "bild"]):
            ok = [r for r in joint if r["method"] == name and not r.get("error")]
            if not ok:
                continue
            tps = sum(r["new_tokens"] for r in ok) / sum(r["seconds"] for r in ok)
            ppl = float(np.exp(-np.mean([r["mean_logprob"] for r in ok])))
            tau = ok[0]["params"].get("tau") if name.startswith("mtad") else None
            ax.scatter(tps, ppl, color="C0" if tau is not None else "C7", marker="o" if tau is not None else "s")
            ax.annotate(
                f"τ={tau:g}" if tau is not None else name,
                (tps, ppl),
                fontsize=8,
                xytext=(4, 3),
                textcoords="offset points",
            )
        ax.set_xlabel("overall tokens/s (this machine)")
        ax.set_ylabel("perplexity under the target (lower is better)")
        ax.set_title("MTAD's τ sweep: perplexity against speed", fontsize=10)
        paths.append(out / "tau_sweep.png")
        fig.savefig(paths[-1], dpi=110)

    th = ctx.theory
    if th and "batch_curve" in th and "sd_opt" in th:
        fig = Figure(figsize=(11, 4), layout="constrained")
        a, b = fig.subplots(1, 2)
        bc = th["batch_curve"]
        a.plot(bc["M"], bc["exact"], label="exact E[rejections]")
        a.axhline(bc["limit"], color="grey", ls="--", label="limit M → ∞")
        for m, v in bc["simulated"].items():
            a.plot(int(m), v, "o", color="C3", label=f"simulated, M={m}")
        a.set_xlabel("draft chains M")
        a.set_ylabel("rejections over the horizon")
        a.set_title("batch SD: rejections fall with M to the limit", fontsize=10)
        a.legend(fontsize=8)
        so = th["sd_opt"]
        rej = np.linspace(0, 1, 100)
        b.plot(rej, np.maximum(so["tv"] - rej, 0), "k-", label="Pareto front max(TV − r, 0)")
        for mode, marker in (("opt", "o"), ("uno", "^")):
            pts = [p for p in so["points"] if p["resample"] == mode]
            b.scatter(
                [p["rejection"] for p in pts],
                [p["bias"] for p in pts],
                marker=marker,
                label=f"sd-opt measured ({mode.upper()})",
            )
        b.set_xlabel("rejection probability")
        b.set_ylabel("bias (TV to the target)")
        b.set_title("one step: sd-opt against the front", fontsize=10)
        b.legend(fontsize=8)
        paths.append(out / "theory.png")
        fig.savefig(paths[-1], dpi=110)
    return paths
