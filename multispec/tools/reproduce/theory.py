"""The simulations behind the theory paper's claims, saved stage by stage so that a resumed report redoes
none: sd and batch-sd rejections on random Markov chains (per run, for bootstrap intervals), the exact
batch curve over M, sd-opt's one-step (token, rejected) draws per ε, and the bridge on the real pair."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..theory import calculators as calc
from ..theory.simulate import first_token_draws, rejections_per_run

EPS = (0.0, 0.02, 0.05, 0.1, 0.2)


def settings(quick: bool) -> dict:
    return {
        "vocab": 7,
        "horizon": 50,
        "runs": 100 if quick else 1000,
        "batch": 4 if quick else 5,
        "opt_runs": 500 if quick else 4000,
        "seed": 0,
        "bridge_prompts": 2 if quick else 10,
        "bridge_tokens": 32 if quick else 64,
        "gamma": 4,
        "temperature": 1.0,
    }


def _save(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def compute(out: Path, quick: bool, target=None, draft=None, prompts=None, say=lambda m: None) -> dict:
    """theory.json under `out`, completed stage by stage (an earlier run's stages are kept when its settings
    are these); the bridge needs the pair and prompt texts."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "theory.json"
    s = settings(quick)
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if data.get("settings") != s:
        data = {"settings": s}
    rng = np.random.default_rng(s["seed"])
    draft_rows, target_rows = (
        calc.uniform_rows(rng, s["horizon"], s["vocab"]),
        calc.uniform_rows(rng, s["horizon"], s["vocab"]),
    )
    sims = data.setdefault("simulations", {})
    if "sd" not in sims:
        say(f"theory: sd on random chains, {s['runs']} runs")
        runs = rejections_per_run(draft_rows, target_rows, s["runs"], "sd", seed=s["seed"])
        sims["sd"] = {"exact": calc.sd_rejections(draft_rows, target_rows).total, "per_run": runs.tolist()}
        _save(path, data)
    if "batch" not in sims:
        m = s["batch"]
        say(f"theory: batch-sd with M={m}, {s['runs']} runs")
        runs = rejections_per_run(draft_rows, target_rows, s["runs"], "batch-sd", seed=s["seed"] + m, drafts=m)
        sims["batch"] = {
            "M": m,
            "exact": calc.batch_rejections(draft_rows, target_rows, m).total,
            "per_run": runs.tolist(),
        }
        ms = list(range(1, 51))
        data["batch_curve"] = {
            "M": ms,
            "exact": [calc.batch_rejections(draft_rows, target_rows, k).total for k in ms],
            "limit": calc.batch_rejections(draft_rows, target_rows, np.inf).total,
            "simulated": {str(m): float(runs.mean())},
        }
        _save(path, data)
    if "sd_opt" not in data:
        d1, t1 = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8))
        tv = float(calc.tv(d1, t1))
        points = []
        for eps in EPS:
            for mode in ("opt", "uno"):
                say(f"theory: sd-opt ε={eps:g} ({mode}), {s['opt_runs']} runs")
                tokens, rejected = first_token_draws(
                    d1, t1, s["opt_runs"], "sd-opt", seed=s["seed"], eps=eps, resample=mode
                )
                law = np.bincount(tokens, minlength=8) / len(tokens)
                b = calc.relaxed_acceptance(d1, t1, eps)
                r = calc.rejection(b, d1)
                exact = b * d1 + r * (calc.optimal_resampling(b, d1, t1) if mode == "opt" else t1)
                points.append(
                    {
                        "eps": eps,
                        "resample": mode,
                        "tokens": tokens.tolist(),
                        "rejected": rejected.tolist(),
                        "rejection": float(rejected.mean()),
                        "bias": float(calc.tv(law, t1)),
                        "exact_law": exact.tolist(),
                        "exact_rejection": float(r),
                        "exact_bias": float(calc.tv(exact, t1)),
                    }
                )
        eps_grid = np.linspace(0, float(d1.max()), 60)
        curve = calc.tradeoff_curve(d1, t1, eps_grid)
        data["sd_opt"] = {
            "draft": d1.tolist(),
            "target": t1.tolist(),
            "tv": tv,
            "points": points,
            "curve": {k: np.asarray(v).tolist() for k, v in curve.items()},
        }
        _save(path, data)
    if target is not None and draft is not None and prompts:
        data["bridge"] = bridge(out, s, target, draft, prompts[: s["bridge_prompts"]], say)
        _save(path, data)
    return data


def bridge(out: Path, s: dict, target, draft, prompts, say) -> dict:
    """Theorem 1 on the real pair, one prompt at a time, appended to bridge.jsonl (resumable)."""
    from ...warp import Sampling
    from ..theory.bridge import predict_and_measure

    path = out / "bridge.jsonl"
    key = {k: s[k] for k in ("gamma", "temperature", "bridge_tokens")} | {"target": target.name, "draft": draft.name}
    rows = (
        [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if path.exists()
        else []
    )
    rows = [r for r in rows if r.get("settings") == key]
    done = {r["prompt_id"] for r in rows}
    with open(path, "a", encoding="utf-8") as log:
        for i, p in enumerate(prompts):
            if p.id in done:
                continue
            say(f"theory: bridge prompt {i + 1}/{len(prompts)}")
            ids = target.encode(p.text, chat=True)
            try:
                (row,) = predict_and_measure(
                    target,
                    draft,
                    [ids],
                    gamma=s["gamma"],
                    max_new_tokens=s["bridge_tokens"],
                    sampling=Sampling(s["temperature"]),
                    seed=s["seed"] + i,
                )
            except ValueError as e:  # a prompt the models cannot take (too long): the others still count
                say(f"theory: bridge prompt {p.id} skipped: {e}")
                continue
            r = {"prompt_id": p.id, "settings": key, **row.__dict__}
            rows.append(r)
            log.write(json.dumps(r) + "\n")
            log.flush()
    wanted = {p.id for p in prompts}
    return {
        "gamma": s["gamma"],
        "temperature": s["temperature"],
        "max_new_tokens": s["bridge_tokens"],
        "rows": [r for r in rows if r["prompt_id"] in wanted],
    }
