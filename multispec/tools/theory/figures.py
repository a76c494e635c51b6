"""The three figures of Yin et al. (2024), computed exactly and by simulation with the library's own decoders.

A: running mean of rejections of `sd` (and `batch-sd` with M = 4, 5) over runs, against Theorems 1/3.
B: expected rejections of batch SD as M grows, with the M -> inf limit (Proposition 1), and the
   single-step batch improvement TV - rho_M for a Bernoulli and a uniform pair.
C: the rejection/bias Pareto front (Theorem 5) with random template algorithms above it and measured
   `sd-opt` points (OPT on the line, UNO above), and r(eps), Loss_OPT(eps), Loss_UNO(eps).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from . import calculators as calc
from .simulate import first_token_law, rejections_per_run, running_mean


def compute(
    vocab: int = 7,
    horizon: int = 50,
    runs: int = 2000,
    batch_sizes=(4, 5),
    seed: int = 0,
    opt_runs: int = 4000,
    progress=None,
) -> dict:
    rng = np.random.default_rng(seed)
    draft, target = calc.uniform_rows(rng, horizon, vocab), calc.uniform_rows(rng, horizon, vocab)
    sd_exact = calc.sd_rejections(draft, target)
    say = progress or (lambda _msg: None)
    say(f"simulating sd: {runs} runs, horizon {horizon}, vocabulary {vocab}")
    sd_runs = rejections_per_run(draft, target, runs, method="sd", seed=seed)
    fig_a = {
        "sd": {
            "exact": sd_exact.total,
            "simulated_mean": float(sd_runs.mean()),
            "simulated_se": float(sd_runs.std(ddof=1) / np.sqrt(runs)),
            "acceleration_exact": sd_exact.acceleration(horizon),
            "expected_calls": sd_exact.expected_calls,
            "running_mean": running_mean(sd_runs).tolist(),
        }
    }
    for m in batch_sizes:
        say(f"simulating batch-sd with M = {m}")
        exact = calc.batch_rejections(draft, target, m)
        sim = rejections_per_run(draft, target, runs, method="batch-sd", seed=seed + m, drafts=m)
        fig_a[f"batch-sd M={m}"] = {
            "exact": exact.total,
            "simulated_mean": float(sim.mean()),
            "simulated_se": float(sim.std(ddof=1) / np.sqrt(runs)),
            "running_mean": running_mean(sim).tolist(),
        }

    ms = list(range(1, 51))
    by_m = [calc.batch_rejections(draft, target, m).total for m in ms]
    limit = calc.batch_rejections(draft, target, np.inf).total
    a, c = 0.3, 0.7
    bern_d, bern_t = np.array([1 - a, a]), np.array([1 - c, c])
    n_uni, k_uni = 10, 4
    uni_d, uni_t = np.full(n_uni, 1 / n_uni), np.r_[np.full(k_uni, 1 / k_uni), np.zeros(n_uni - k_uni)]
    fig_b = {
        "M": ms,
        "expected_rejections": by_m,
        "limit": limit,
        "sd": sd_exact.total,
        "bernoulli": [float(calc.tv(bern_d, bern_t) - calc.batch_first_token(bern_d, bern_t, m)[0]) for m in ms],
        "uniform": [float(calc.tv(uni_d, uni_t) - calc.batch_first_token(uni_d, uni_t, m)[0]) for m in ms],
        "uniform_reversed": [float(calc.tv(uni_t, uni_d) - calc.batch_first_token(uni_t, uni_d, m)[0]) for m in ms],
        "simulated": {m: fig_a[f"batch-sd M={m}"]["simulated_mean"] for m in batch_sizes},
    }

    # one step: a random pair, the front, random template algorithms, and measured sd-opt points
    d1, t1 = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8))
    tv1 = float(calc.tv(d1, t1))
    scatter = []
    for _ in range(300):
        b = rng.uniform(size=8) ** rng.uniform(0.2, 3)
        resampling = rng.dirichlet(np.ones(8))
        scatter.append((calc.rejection(b, d1), calc.loss_of(b, resampling, d1, t1)))
    eps_grid = np.linspace(0, float(d1.max()), 60)
    curve = calc.tradeoff_curve(d1, t1, eps_grid)
    measured = []
    for eps in (0.0, 0.02, 0.05, 0.1, 0.2):
        for mode in ("opt", "uno"):
            say(f"measuring sd-opt eps={eps} ({mode})")
            law, rej = first_token_law(d1, t1, opt_runs, "sd-opt", seed=seed, eps=eps, resample=mode)
            b = calc.relaxed_acceptance(d1, t1, eps)
            exact_law = b * d1 + calc.rejection(b, d1) * (calc.optimal_resampling(b, d1, t1) if mode == "opt" else t1)
            measured.append(
                {
                    "eps": eps,
                    "resample": mode,
                    "rejection": rej,
                    "bias": float(calc.tv(law, t1)),
                    "exact_rejection": calc.rejection(b, d1),
                    "exact_bias": float(calc.tv(exact_law, t1)),
                    "law_error": float(calc.tv(law, exact_law)),
                }
            )
    fig_c = {
        "tv": tv1,
        "random_algorithms": scatter,
        "curve": {k: np.asarray(v).tolist() for k, v in curve.items()},
        "measured": measured,
        "opt_runs": opt_runs,
    }
    return {
        "settings": {
            "vocab": vocab,
            "horizon": horizon,
            "runs": runs,
            "seed": seed,
            "rows": "u / sum(u), u ~ Uniform[0,1]^V",
            "prompt": "x0 ~ Uniform(V)",
        },
        "fig_a": fig_a,
        "fig_b": fig_b,
        "fig_c": fig_c,
    }


def plot(data: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    s = data["settings"]

    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = ["tab:green", "tab:blue", "tab:purple", "tab:brown"]
    for (name, d), col in zip(data["fig_a"].items(), colours, strict=False):
        rm = np.asarray(d["running_mean"])
        ax.plot(np.arange(1, len(rm) + 1), rm, color=col, lw=1.2, label=f"{name}: simulated running mean")
        ax.axhline(d["exact"], color=col, ls="--", lw=1, label=f"{name}: exact {d['exact']:.3f}")
    ax.set_xlabel("runs")
    ax.set_ylabel("rejections per generation")
    ax.set_title(f"A. Rejections of sd and batch-sd vs theory (V={s['vocab']}, T={s['horizon']})")
    ax.set_xscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "fig_a_rejections.png")
    fig.savefig(paths[-1], dpi=130)
    plt.close(fig)

    b = data["fig_b"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(b["M"], b["expected_rejections"], "o-", ms=3, label="Theorem 3")
    sim = b["simulated"]
    if sim:
        ax1.scatter(
            [int(m) for m in sim],
            list(sim.values()),
            marker="x",
            color="tab:red",
            zorder=3,
            s=40,
            label="batch-sd simulated",
        )
    ax1.axhline(b["limit"], color="k", ls="--", lw=1, label=f"M → ∞ limit {b['limit']:.3f}")
    ax1.axhline(b["sd"], color="tab:green", ls=":", lw=1, label=f"SD (M = 1) {b['sd']:.3f}")
    ax1.set_xlabel("batch size M")
    ax1.set_ylabel("expected rejections")
    ax1.set_title("B. Batch SD: rejections as M grows")
    ax1.legend(fontsize=8)
    ax2.plot(b["M"], b["bernoulli"], "o-", ms=3, label="Bernoulli draft 0.3, target 0.7")
    ax2.plot(b["M"], b["uniform"], "s-", ms=3, label="draft Unif(10), target Unif(4 ⊂ 10)")
    ax2.plot(b["M"], b["uniform_reversed"], "^-", ms=3, label="draft Unif(4 ⊂ 10), target Unif(10): none")
    ax2.set_xlabel("batch size M")
    ax2.set_ylabel("batch improvement TV − ρ_M (one step)")
    ax2.set_title("B. Diminishing returns of batching")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "fig_b_batch.png")
    fig.savefig(paths[-1], dpi=130)
    plt.close(fig)

    c = data["fig_c"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    sc = np.asarray(c["random_algorithms"])
    ax1.scatter(sc[:, 0], sc[:, 1], s=6, color="lightgray", label="random (b, P) template algorithms")
    rej = np.linspace(0, 1, 100)
    ax1.plot(rej, np.maximum(c["tv"] - rej, 0), "k-", lw=1.5, label="Pareto front: bias = TV − rejection")
    ax1.fill_between(rej, 0, np.maximum(c["tv"] - rej, 0), color="mistyrose", label="unattainable")
    for mode, marker, col in (("opt", "o", "tab:blue"), ("uno", "^", "tab:orange")):
        pts = [m for m in c["measured"] if m["resample"] == mode]
        ax1.scatter(
            [p["rejection"] for p in pts],
            [p["bias"] for p in pts],
            marker=marker,
            color=col,
            s=30,
            zorder=3,
            label=f"sd-opt measured ({mode.upper()})",
        )
    ax1.set_xlabel("rejection probability")
    ax1.set_ylabel("bias TV(output, target)")
    ax1.set_xlim(0, max(1.05 * c["tv"], float(sc[:, 0].max())))
    ax1.set_ylim(0, None)
    ax1.set_title("C. Rejection vs bias (one step)")
    ax1.legend(fontsize=7)
    cu = c["curve"]
    ax2.plot(cu["eps"], cu["rejection"], label="rejection r(ε)")
    ax2.plot(cu["eps"], cu["loss_opt"], label="bias, Decoding-OPT")
    ax2.plot(cu["eps"], cu["loss_uno"], label="bias, Decoding-UNO")
    ax2.plot(cu["eps"], np.asarray(cu["rejection"]) + np.asarray(cu["loss_opt"]), "k:", label="r + OPT bias = TV")
    ax2.set_xlabel("over-acceptance ε")
    ax2.set_title("C. b(x) = min(1, (target + ε) / draft)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "fig_c_pareto.png")
    fig.savefig(paths[-1], dpi=130)
    plt.close(fig)

    (out / "theory.json").write_text(json.dumps(data))
    return paths
