"""`multispec reproduce`: run the experiments behind the selected claims (each a resumable bench run in its
own folder), the theory simulations, then compute every claim's row and write REPORT.md, claims.json and
the figures."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from ...models.base import LanguageModel
from ..bench import load_prompt_file, pick_meter, read_results, run_bench, select_prompts
from ..bench.runner import RESULTS
from . import theory
from .claims import EXPERIMENTS, Claim, Context, select
from .report import write

QUICK_MINUTES, FULL_MINUTES = 10, 90  # what the report promises on the machine it was built for


def reproduce(
    target: LanguageModel,
    draft: LanguageModel,
    out: str | Path = "reproduce-out",
    *,
    quick: bool = False,
    claims: list[str] | None = None,
    resume: bool = False,
    force: bool = False,
    device_curve: str | Path | None = None,
    models: dict[str, str] | None = None,
    meter="auto",
    progress: bool = True,
    command: str | None = None,
) -> dict:
    """Run and write the report; return claims.json's content."""
    chosen = select(claims)
    if draft is None:
        raise ValueError("reproduce needs a draft model: every paper's method drafts")
    curves = _read_curves(device_curve)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    names = list(dict.fromkeys(e for c in chosen for e in c.experiments))
    started = [out / n / RESULTS for n in EXPERIMENTS] + [out / "theory" / "theory.json", out / "claims.json"]
    if any(p.exists() for p in started) and not (resume or force):
        raise ValueError(
            f"{out} holds an earlier report: pass --resume to continue it, --force to start again, "
            "or choose another --out"
        )
    if force and not resume:
        for n in [*EXPERIMENTS, "theory"]:
            shutil.rmtree(out / n, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    say = (
        (lambda m: print(f"reproduce [{time.perf_counter() - t0:.0f} s]: {m}", file=sys.stderr))
        if progress
        else (lambda m: None)
    )
    if meter == "auto":
        meter = pick_meter(str(target.device))
    for name in names:
        e = EXPERIMENTS[name]
        prompts = select_prompts([load_prompt_file(e.prompts)], limit=e.limit[not quick], spread=e.spread)
        methods = list(e.methods)
        say(f"{name}: {len(methods)} methods x {len(prompts)} prompts ({e.setting(quick)})")
        run_bench(
            target,
            draft,
            prompts,
            methods,
            out / name,
            temperatures=[e.temperature],
            max_new_tokens=e.max_new_tokens[not quick],
            top_k=e.top_k,
            top_p=e.top_p,
            baseline=methods[0],
            resume=True,
            meter=meter,
            progress=progress,
            models=models,
        )
    theory_data = None
    if any(c.theory for c in chosen):
        bridge_prompts = select_prompts([load_prompt_file("spec-bench-dev")], spread=True)
        theory_data = theory.compute(out / "theory", quick, target, draft, bridge_prompts, say)
    ctx = Context({n: read_results(out / n / RESULTS) for n in names}, theory_data, quick)
    rows, skipped = [], []
    for c in chosen:
        if c.energy and meter is None:
            skipped.append(
                {
                    "id": c.id,
                    "paper": c.paper,
                    "claim": c.text,
                    "reason": "no energy meter on this machine (no NVML GPU, no readable RAPL powercap)",
                }
            )
            continue
        rows.append(claim_row(c, ctx))
    meta = {
        "target": target.name,
        "draft": draft.name,
        "models": models or {},
        "quick": quick,
        "device": str(target.device),
        "meter": meter.name if meter is not None else None,
        "date": time.strftime("%Y-%m-%d"),
        "command": command,
        "experiments": {n: EXPERIMENTS[n].setting(quick) for n in names},
        "seconds_this_run": time.perf_counter() - t0,
    }
    data = {"format": "multispec-reproduce/1", "meta": meta, "claims": rows, "not_measured": skipped}
    return write(out, data, ctx, curves)


def claim_row(c: Claim, ctx: Context) -> dict:
    from .stats import NOT, verdict

    row = {
        "id": c.id,
        "paper": c.paper,
        "claim": c.text,
        "paper_setting": c.paper_setting,
        "paper_value": c.paper_value,
        "expected": c.expected,
        "direction": c.direction,
        "null": c.null,
        "unit": c.unit,
        "statistic": c.statistic,
        "margin": c.margin if c.direction == 0 else None,
        "experiment": c.experiments[0] if c.experiments else "theory",
    }
    try:
        est, setting, cause = c.measure(ctx)
    except (ValueError, KeyError, ZeroDivisionError) as e:
        return {
            **row,
            "our_setting": None,
            "value": None,
            "interval": None,
            "n": 0,
            "verdict": NOT,
            "cause": f"not measured: {e}",
        }
    return {
        **row,
        "our_setting": setting,
        "value": est.value,
        "interval": [est.low, est.high],
        "n": est.n,
        "verdict": verdict(est, c.null, c.direction, c.expected, c.margin),
        "cause": cause + _width(est, c),
    }


def _width(est, c: Claim) -> str:
    """Why an equality claim whose interval holds the claimed value is still not reproduced."""
    if (
        c.direction == 0
        and est.low <= c.null <= est.high
        and not (c.null - c.margin <= est.low and est.high <= c.null + c.margin)
    ):
        return f"; the interval holds {c.null:g} but is wider than ±{c.margin:g}: too few prompts or runs to show it"
    return ""


def _read_curves(path):
    if path is None:
        return None
    from ...models.cost import read_cost_curves

    curves, data = read_cost_curves(path)
    if "target" not in curves:
        raise ValueError(f"{path} holds no target curve; record one with `multispec cost-curve --out FILE`")
    return {"curves": curves, "data": data, "path": str(path)}


def load_claims(out: str | Path) -> dict:
    return json.loads((Path(out) / "claims.json").read_text(encoding="utf-8"))
