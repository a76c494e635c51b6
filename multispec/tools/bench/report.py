"""From the per-generation rows to summary.json, report.md and two PNG plots.

Per temperature and method: medians with quartiles over prompts for the speed counters, the speed-up as
the median over prompts of the per-prompt tokens/s ratio to the baseline (paired: same prompt, same
seed), perplexity aggregated as MTAD does, mean ROUGE-L and exact match, corpus BLEU, and J/token as
total energy over total tokens.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np

from . import metrics

SPREAD_KEYS = (
    "tokens_per_second",
    "speedup",
    "block_efficiency",
    "acceptance_rate",
    "target_calls",
    "draft_calls",
    "new_tokens",
    "seconds",
    "predicted_tokens_per_second",
    "decode_tokens_per_second",
    "measured_over_predicted",
    "peak_memory_mb",
)


def summarise(rows: list[dict], baseline: str, order: list[str] | None = None) -> dict:
    """{temperature: {"methods": {label: stats}, "categories": {category: {label: stats}}}}."""
    out = {}
    for t in sorted({r["temperature"] for r in rows}):
        at_t = [r for r in rows if r["temperature"] == t]
        base = {r["prompt_id"]: r for r in at_t if r["method"] == baseline and not r.get("error")}
        for r in at_t:
            b = base.get(r["prompt_id"])
            ok = not r.get("error") and b is not None and r["tokens_per_second"] and b["tokens_per_second"]
            r["speedup"] = r["tokens_per_second"] / b["tokens_per_second"] if ok else None
            predicted, decode = r.get("predicted_tokens_per_second"), r.get("decode_tokens_per_second")
            r["measured_over_predicted"] = decode / predicted if predicted and decode else None
        labels = _ordered({r["method"] for r in at_t}, order, baseline)
        cats = list(dict.fromkeys(r["category"] for r in at_t))
        out[str(t)] = {
            "methods": {m: _stats([r for r in at_t if r["method"] == m]) for m in labels},
            "categories": {
                c: {m: _stats([r for r in at_t if r["method"] == m and r["category"] == c]) for m in labels}
                for c in cats
            },
        }
    return out


def _ordered(labels: set[str], order: list[str] | None, baseline: str) -> list[str]:
    first = [baseline] + [m for m in (order or []) if m != baseline]
    return [m for m in first if m in labels] + sorted(labels - set(first))


def _stats(rows: list[dict]) -> dict:
    ok = [r for r in rows if not r.get("error")]
    s = {
        "prompts": len(ok),
        "errors": len(rows) - len(ok),
        "first_error": next((r["error"] for r in rows if r.get("error")), None),
    }
    for key in SPREAD_KEYS:
        s[key] = metrics.spread(r.get(key) for r in ok)
    logps = [r["mean_logprob"] for r in ok if r.get("mean_logprob") is not None]
    s["perplexity"] = metrics.perplexity(logps)
    tokens = sum(r["new_tokens"] for r in ok if r.get("mean_logprob") is not None)
    weighted = sum(r["mean_logprob"] * r["new_tokens"] for r in ok if r.get("mean_logprob") is not None)
    s["perplexity_token_weighted"] = float(np.exp(-weighted / tokens)) if tokens else None
    scored = [r for r in ok if r.get("rouge_l") is not None]
    s["references"] = len(scored)
    s["rouge_l"] = float(np.mean([r["rouge_l"] for r in scored])) if scored else None
    s["exact_match"] = float(np.mean([r["exact_match"] for r in scored])) if scored else None
    s["bleu"] = metrics.corpus_bleu([r["text"] for r in scored], [r["reference"] for r in scored])
    total_tokens = sum(r["new_tokens"] for r in ok)
    total_seconds = sum(r["seconds"] for r in ok)
    s["tokens_per_second_overall"] = total_tokens / total_seconds if total_seconds else None
    measured = [r for r in ok if r.get("energy_j") is not None]
    energy_tokens = sum(r["new_tokens"] for r in measured)
    s["energy_j"] = sum(r["energy_j"] for r in measured) if measured else None
    s["j_per_token"] = s["energy_j"] / energy_tokens if measured and energy_tokens else None
    return s


def write_report(out: str | Path, rows: list[dict], meta: dict) -> dict:
    out = Path(out)
    summary = {
        "meta": {**meta, "python": platform.python_version(), "machine": platform.machine()},
        "temperatures": summarise(rows, meta["baseline"], meta.get("methods")),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    plots = plot(summary, out)
    (out / "report.md").write_text(markdown(summary, [p.name for p in plots]), encoding="utf-8")
    return summary


# -- markdown ------------------------------------------------------------------------------------


def _num(x, digits=2) -> str:
    if x is None:
        return "–"
    return f"{x:.{digits}f}" if abs(x) < 1000 else f"{x:.0f}"


def _cell(s: dict | None, digits=2) -> str:
    if s is None:
        return "–"
    return f"{_num(s['median'], digits)} ({_num(s['q1'], digits)}–{_num(s['q3'], digits)})"


COLUMNS = [  # header, how to show one method's stats
    ("ok / err", lambda s, m: f"{s['prompts']} / {s['errors']}"),
    ("tokens/s", lambda s, m: _cell(s["tokens_per_second"], 1)),
    ("speed-up", lambda s, m: _cell(s["speedup"])),
    ("block eff.", lambda s, m: _cell(s["block_efficiency"])),
    ("acceptance", lambda s, m: _cell(s["acceptance_rate"])),
    ("target calls", lambda s, m: _cell(s["target_calls"], 0)),
    ("draft calls", lambda s, m: _cell(s["draft_calls"], 0)),
    ("new tokens", lambda s, m: _cell(s["new_tokens"], 0)),
    ("PPL", lambda s, m: _num(s["perplexity"])),
    ("ROUGE-L", lambda s, m: _num(s["rouge_l"], 3)),
    ("BLEU", lambda s, m: _num(s["bleu"], 1)),
    ("EM", lambda s, m: _num(s["exact_match"])),
    ("peak MB", lambda s, m: _cell(s["peak_memory_mb"], 0)),
    ("J/token", lambda s, m: _num(s["j_per_token"], 3) if m["meter"] else "unavailable"),
]


def markdown(summary: dict, plots: list[str]) -> str:
    m = summary["meta"]
    st = m["settings"]
    base = m["baseline"]
    models = m.get("models") or {}
    pair = " / ".join(f"{k}: {models.get(v, v)}" for k, v in (("target", st["target"]), ("draft", st["draft"])) if v)
    lines = [
        "# multispec bench",
        "",
        f"- models: {pair}",
        f"- {m['prompts']} prompts, at most {st['max_new_tokens']} new tokens, top-k {st['top_k']}, top-p "
        f"{st['top_p']}, seed {st['seed']}, chat template {'on' if st['chat'] else 'off'}; one prompt at a time",
        f"- device {m['device']}, {m['threads']} torch threads, torch {m['torch']}, Python {m['python']}"
        + _load_note(m),
        *(
            [
                f"- spread over {m['processes']} processes"
                + (
                    " sharing the CPU: timings, speed-ups and energy are not comparable with a one-process run"
                    if m["device"].startswith("cpu")
                    else ""
                )
            ]
            if (m.get("processes") or 1) > 1
            else []
        ),
        f"- energy: {m['meter']}"
        if m["meter"]
        else "- energy: **unavailable** (no readable energy counter: no NVML GPU, no readable RAPL powercap); "
        "nothing is estimated",
        "",
    ]
    for t, data in summary["temperatures"].items():
        meths = data["methods"]
        lines += [
            f"## Temperature {float(t):g}" + (" (greedy)" if float(t) == 0 else ""),
            "",
            "| method | " + " | ".join(h for h, _ in COLUMNS) + " |",
            "|---|" + "---|" * len(COLUMNS),
        ]
        lines += [f"| {name} | " + " | ".join(f(s, m) for _, f in COLUMNS) + " |" for name, s in meths.items()]
        cats = list(data["categories"])
        size = {c: max(s["prompts"] + s["errors"] for s in data["categories"][c].values()) for c in cats}
        lines += [
            "",
            f"Speed-up against `{base}` by category (median (first quartile – third quartile) over "
            "prompts; n = prompts):",
            "",
            "| method | "
            + " | ".join(f"{c} (n={size[c]})" for c in cats)
            + f" | all (n={max(s['prompts'] + s['errors'] for s in meths.values())}) |",
            "|---|" + "---|" * (len(cats) + 1),
        ]
        for name in [n for n in meths if n != base]:
            cells = [_cell(data["categories"][c][name]["speedup"]) for c in cats]
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {_cell(meths[name]['speedup'])} |")
        predicted = [n for n, s in meths.items() if s["predicted_tokens_per_second"]]
        if predicted:
            lines += [
                "",
                "Draft-length controller (`gamma=auto`): its predicted decoding speed against the measured "
                "one (prefill excluded from both):",
                "",
                "| method | predicted tokens/s | measured tokens/s | measured / predicted |",
                "|---|---|---|---|",
            ]
            lines += [
                f"| {n} | {_cell(meths[n]['predicted_tokens_per_second'], 1)} | "
                f"{_cell(meths[n]['decode_tokens_per_second'], 1)} | {_cell(meths[n]['measured_over_predicted'])} |"
                for n in predicted
            ]
        lines += ["", *_verdicts(data, base), ""]
        errors = {n: s["first_error"] for n, s in meths.items() if s["errors"]}
        if errors:
            lines += ["Errors (first message per method; every failed row is in results.jsonl):", ""]
            lines += [f"- {n}: {meths[n]['errors']} failed — {e}" for n, e in errors.items()] + [""]
    lines += [
        "## How to read this",
        "",
        "- Cells are median (first quartile – third quartile) over prompts.",
        "- tokens/s = new tokens / wall time of one generate call, **prefill included**, for every method alike.",
        f"- speed-up = median over prompts of (tokens/s of the method / tokens/s of `{base}` on the same prompt "
        "and seed); above 1 is faster. The tokens/s column is the median of each method's own per-prompt "
        "speeds: over prompts of different lengths the two medians can disagree (a method can show a higher "
        "median tokens/s than the baseline and still be slower on most prompts); the speed-up is the paired "
        "comparison and the one the verdicts use.",
        "- block efficiency = new tokens / target forward calls (prefill counted as one call); for `hf` and "
        "`hf-assisted` the calls are counted with a forward hook on transformers' model.",
        "- acceptance = accepted draft tokens / drafted tokens, from the method's own counters (not available for hf).",
        "- PPL = exp(−mean over prompts of the mean log p(token | prefix)) of the generated tokens (EOS "
        "included) under the unwarped target; lower means the target finds the output more likely.",
        "- ROUGE-L (F, rouge-score) and exact match (lower-cased, no punctuation or articles) are means over "
        "prompts with a reference; BLEU is sacrebleu's corpus BLEU over them; – means no reference.",
        "- peak MB = memory one generation held above what was held when it started: on CUDA torch's allocator "
        "peak; elsewhere the process's resident set, read every 2 ms after handing free heap pages back (it can "
        "under-read: a peak shorter than 2 ms is missed). Model weights are not counted; the KV cache and the "
        "activations are.",
        "- J/token = energy counter difference over the generations / their new tokens; the counters cover "
        "the whole device, so other work on it is counted too.",
        "",
        *[f"![{p}]({p})" for p in plots],
        "",
    ]
    return "\n".join(lines)


def _load_note(m: dict) -> str:
    load, cpus = m.get("load_average") or [None, None], m.get("cpus")
    if None in load or not cpus:
        return ""
    # this run's own threads count too; a load well above the torch threads means other work competed
    return f"; 1-min load average {load[0]:.1f} at the start, {load[1]:.1f} at the end on {cpus} CPUs"


def _verdicts(data: dict, base: str) -> list[str]:
    meths = data["methods"]
    med = {n: (s["speedup"] or {}).get("median") for n, s in meths.items() if n != base}
    med = {n: v for n, v in med.items() if v is not None}
    if not med:
        return [f"No method other than `{base}` finished a prompt."]
    best = max(med, key=med.get)
    if med[best] > 1:
        out = [f"**Fastest overall: `{best}`**, {med[best]:.2f}× `{base}` (median per-prompt speed-up)."]
    else:
        out = [f"**Nothing is faster than `{base}` here**; the closest is `{best}` at {med[best]:.2f}×."]
    per_cat = []
    for c, by in data["categories"].items():
        v = {n: (s["speedup"] or {}).get("median") for n, s in by.items() if n != base}
        v = {n: x for n, x in v.items() if x is not None}
        if v:
            w = max(v, key=v.get)
            per_cat.append(
                f"{c}: `{w}` ({v[w]:.2f}×)"
                if v[w] > 1
                else f"{c}: none faster than `{base}` (closest `{w}`, {v[w]:.2f}×)"
            )
    if per_cat:
        out.append("Fastest per category (median per-prompt speed-up): " + "; ".join(per_cat) + ".")
    ppl = {n: s["perplexity"] for n, s in meths.items() if s["perplexity"] is not None}
    if len(ppl) > 1:
        lo, hi = min(ppl, key=ppl.get), max(ppl, key=ppl.get)
        if ppl[hi] <= 1.01 * ppl[lo]:
            out.append(f"Perplexity is the same within 1 % for every method ({ppl[lo]:.2f}).")
        else:
            out.append(
                f"Lowest perplexity: `{lo}` ({ppl[lo]:.2f}); highest: `{hi}` ({ppl[hi]:.2f}); "
                f"`{base}`: {_num(ppl.get(base))}."
            )
    return out


# -- plots ---------------------------------------------------------------------------------------


def plot(summary: dict, out: Path) -> list[Path]:
    """speedup.png (per method and category, one panel per temperature) and quality_speed.png."""
    from matplotlib.figure import Figure  # no pyplot: leaves the caller's backend alone

    base = summary["meta"]["baseline"]
    temps = summary["temperatures"]
    paths = []
    fig = Figure(figsize=(max(6, 1.6 * _max_groups(temps)), 3.6 * len(temps)), layout="constrained")
    axes = fig.subplots(len(temps), 1, squeeze=False)[:, 0]
    for ax, (t, data) in zip(axes, temps.items(), strict=True):
        names = [n for n in data["methods"] if n != base]
        groups = [*data["categories"], "all"]
        width = 0.8 / max(1, len(names))
        for i, n in enumerate(names):
            sp = [(data["categories"][g][n] if g != "all" else data["methods"][n])["speedup"] for g in groups]
            med = np.array([v["median"] if v else np.nan for v in sp])
            # quartiles of fewer than two prompts say nothing: no error bar there
            err = np.array(
                [[v["median"] - v["q1"], v["q3"] - v["median"]] if v and v["n"] > 1 else [np.nan] * 2 for v in sp]
            ).T
            x = np.arange(len(groups)) + (i - (len(names) - 1) / 2) * width
            colour = f"C{list(data['methods']).index(n) % 10}"  # the same colour per method in both plots
            ax.bar(x, np.nan_to_num(med), width, yerr=err, capsize=2, label=n, color=colour, error_kw={"lw": 0.8})
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(np.arange(len(groups)), groups, rotation=20, ha="right")
        ax.set_ylabel(f"speed-up vs {base}")
        ax.set_title(
            f"temperature {float(t):g}: median per-prompt speed-up, bars to the quartiles (dashed: {base})", fontsize=10
        )
        if names:
            ax.legend(fontsize=8, ncols=min(4, len(names)))
    paths.append(out / "speedup.png")
    fig.savefig(paths[-1], dpi=110)

    has_rouge = any(s["rouge_l"] is not None for d in temps.values() for s in d["methods"].values())
    fig = Figure(figsize=(6.5 * (1 + has_rouge), 4.2), layout="constrained")
    axes = fig.subplots(1, 1 + has_rouge, squeeze=False)[0]
    quality = [("perplexity", "perplexity under the target (lower is better)")]
    if has_rouge:
        quality.append(("rouge_l", "mean ROUGE-L (higher is better)"))
    methods = list(dict.fromkeys(n for d in temps.values() for n in d["methods"]))
    for ax, (key, label) in zip(axes, quality, strict=True):
        for marker, (t, data) in zip("os^vDP*", temps.items(), strict=False):
            for n, s in data["methods"].items():  # colour: the method; marker: the temperature
                x, y = (s["speedup"] or {}).get("median"), s[key]
                if x is not None and y is not None:
                    ax.scatter(
                        x, y, marker=marker, color=f"C{methods.index(n) % 10}", s=40, label=f"{n}, T={float(t):g}"
                    )
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        values = [s[key] for d in temps.values() for s in d["methods"].values() if s[key] is not None]
        if values and max(values) <= 1.01 * min(values):  # all alike: show that, not a zoom into noise
            mid = (max(values) + min(values)) / 2
            ax.set_ylim(mid * 0.9, mid * 1.1)
        ax.set_xlabel(f"median speed-up vs {base} (right is faster)")
        ax.set_ylabel(label)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle("quality vs speed, one point per method and temperature")
    paths.append(out / "quality_speed.png")
    fig.savefig(paths[-1], dpi=110)
    return paths


def _max_groups(temps: dict) -> int:
    return max(len(d["categories"]) + 1 for d in temps.values())
