"""The seed papers' headline claims, each with the experiment behind it and how our number is computed.

An `Experiment` is one bench run (prompt set, sampling settings, methods); a `Claim` compares two methods
of one experiment (or reads the theory simulations) and becomes one row of the report: the paper's
setting and number, ours with a 95 % paired-bootstrap interval, a verdict and the measured cause.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import stats
from .stats import Estimate


@dataclass(frozen=True)
class Experiment:
    name: str  # its folder under the report's --out
    prompts: str  # a shipped prompt set
    spread: bool  # take the set's categories in turn (False: file order, "the first N")
    limit: tuple[int, int]  # prompts: (--quick, full)
    max_new_tokens: tuple[int, int]
    temperature: float
    top_k: int
    top_p: float
    methods: tuple[str, ...]  # the first is the bench's baseline
    label: str = ""  # what the prompts stand for in the papers' terms

    def setting(self, quick: bool) -> str:
        warp = (
            f"T={self.temperature:g}"
            + (f", top-k {self.top_k}" if self.top_k else "")
            + (f", top-p {self.top_p:g}" if self.top_p < 1 else "")
        )
        n = self.limit[quick is False]
        return f"{self.label or self.prompts}, {n} prompts, {warp}, {self.max_new_tokens[quick is False]} new tokens"


MTAD = "mtad"  # gamma 4, 8 beams, tau 0.1: Table 13's MT-Bench/CNN settings for the Llama pair
TAUS = (0.0, 0.9, 1.0)  # with the default 0.1: the sweep of the perplexity/speed figure
EXPERIMENTS = {
    e.name: e
    for e in [
        Experiment(
            "joint",
            "spec-bench-dev",
            True,
            (3, 15),
            (32, 64),
            1.0,
            20,
            0.9,
            ("ar", "sd:gamma=4", MTAD, "mjsd", "bild", *(f"mtad:tau={t:g}" for t in TAUS)),
            label="Spec-Bench dev (all five categories in turn)",
        ),
        Experiment(
            "dsbd",
            "spec-bench-dev",
            True,
            (3, 10),
            (32, 64),
            1.0,
            10,
            0.8,
            ("beam:width=3", "dsbd", "dsbd:width_threshold=0", "dsbd:one_cache=true"),
            label="Spec-Bench dev (all five categories in turn)",
        ),
        Experiment(
            "mcsd-alpaca",
            "mt-bench",
            True,
            (3, 15),
            (32, 96),
            1.0,
            0,
            1.0,
            (
                "ar",
                "sd:gamma=3",
                "mcsd:k_config=4x2x2",
                "mcsd:k_config=4x2x2,replacement=true",
                "mcsd:k_config=4x2x2,tree_attention=false",
                "mcsd:k_config=4x2x2,verifier=naive",
                "specinfer:k_config=4x2x2",
            ),
            label="MT-Bench in place of Alpaca (the draft trained on Alpaca's seed tasks)",
        ),
        Experiment(
            "mcsd-wmt",
            "wmt-ende",
            False,
            (3, 15),
            (32, 96),
            1.0,
            0,
            1.0,
            ("ar", "sd:gamma=2", "mcsd:k_config=8x2", "mcsd:k_config=8x2,replacement=true"),
            label="WMT En→De, the first prompts (held out from the draft's training)",
        ),
    ]
}


@dataclass
class Context:
    """What the claims read: each experiment's rows, the theory data, whether energy was metered."""

    rows: dict[str, list[dict]]
    theory: dict | None = None
    quick: bool = False

    def paired(self, experiment: str, a: str, b: str, keys: tuple[str, ...]) -> tuple[np.ndarray, ...]:
        """Per-prompt values of `keys` for method a then method b, on the prompts both finished."""
        by = {}
        for r in self.rows.get(experiment, []):
            if not r.get("error") and r.get("new_tokens") and all(r.get(k) is not None for k in keys):
                by.setdefault(r["method"], {})[r["prompt_id"]] = r
        ra, rb = by.get(a, {}), by.get(b, {})
        common = [p for p in ra if p in rb]
        return tuple(
            np.array([[src[p][k] for p in common] for k in keys], dtype=float).reshape(len(keys), -1)
            for src in (ra, rb)
        )

    def method_rows(self, experiment: str, method: str) -> list[dict]:
        return [r for r in self.rows.get(experiment, []) if r["method"] == method and not r.get("error")]


@dataclass
class Claim:
    id: str
    paper: str  # short name of the seed paper
    text: str  # the claim as the paper makes it
    paper_setting: str
    paper_value: str  # as the paper reports it
    expected: tuple[float, float] | None  # the paper's number (or range) in the statistic's units
    direction: int  # +1: above `null`, -1: below, 0: equal to it
    null: float  # the statistic's value when there is no effect
    unit: str  # how the statistic reads: "×" (a ratio) or "" (a plain number)
    measure: Callable[[Context], tuple[Estimate, str, str]]  # -> (estimate, our setting, measured cause)
    experiments: tuple[str, ...] = ()
    theory: bool = False
    energy: bool = False  # needs an energy meter
    statistic: str = ""  # what our number is, in words
    margin: float = 0.05  # an equality claim holds when the interval lies within null ± this
    extra: dict = field(default_factory=dict)


# -- measures: comparisons of two methods in one experiment ---------------------------------------


def _summary(rows: list[dict]) -> dict:
    tokens = sum(r["new_tokens"] for r in rows)
    calls = sum(r["target_calls"] for r in rows)
    secs = sum(r["seconds"] for r in rows)
    split = (
        {k: sum(r.get(f"{k}_seconds") or 0 for r in rows) / secs for k in ("target", "draft", "other")} if secs else {}
    )
    acc = [r["acceptance_rate"] for r in rows if r.get("acceptance_rate") is not None]
    return {
        "tokens": tokens,
        "block": tokens / calls if calls else None,
        "tps": tokens / secs if secs else None,
        "per_call_ms": 1000 * secs / calls if calls else None,
        "split": split,
        "acceptance": float(np.mean(acc)) if acc else None,
        "ppl": float(np.exp(-np.mean([r["mean_logprob"] for r in rows]))) if rows else None,
    }


def _split(s: dict) -> str:
    sp = s["split"]
    return f"target {sp['target']:.0%} / draft {sp['draft']:.0%} / other {sp['other']:.0%}" if sp else "–"


def _f(x, d=2) -> str:
    return "–" if x is None else f"{x:.{d}f}"


def _cause(kind: str, a: str, b: str, sa: dict, sb: dict) -> str:
    if kind == "speed":
        blk = sa["block"] / sb["block"] if sa["block"] and sb["block"] else None
        cost = sa["per_call_ms"] / sb["per_call_ms"] if sa["per_call_ms"] and sb["per_call_ms"] else None
        return (
            f"speed ratio = block-efficiency ratio {_f(blk)} ({_f(sa['block'])} vs {_f(sb['block'])} tokens per "
            f"target call) ÷ cost-per-call ratio {_f(cost)} ({_f(sa['per_call_ms'], 0)} vs "
            f"{_f(sb['per_call_ms'], 0)} ms); time split `{a}`: {_split(sa)}; `{b}`: {_split(sb)}"
        )
    if kind == "ppl":
        return (
            f"perplexity {_f(sa['ppl'])} vs {_f(sb['ppl'])}; draft acceptance `{a}` {_f(sa['acceptance'])}, "
            f"`{b}` {_f(sb['acceptance'])}; tokens per call {_f(sa['block'])} vs {_f(sb['block'])}"
        )
    if kind == "block":
        return (
            f"tokens per target call {_f(sa['block'])} vs {_f(sb['block'])}; draft acceptance (draft quality) "
            f"`{a}` {_f(sa['acceptance'])}, `{b}` {_f(sb['acceptance'])}"
        )
    if kind == "memory":
        return f"peak memory above the weights, mean over prompts: `{a}` vs `{b}` (RSS on CPU, allocator on CUDA)"
    return ""


KINDS = {  # per-prompt keys for a and b, the statistic on them
    "speed": (("new_tokens", "seconds"), stats.throughput_ratio),
    "ppl": (("mean_logprob",), stats.perplexity_ratio),
    "block": (("new_tokens", "target_calls"), stats.per_call_ratio),
    "energy": (("energy_j", "new_tokens"), stats.saving_ratio),
    "memory": (("peak_memory_mb",), stats.mean_ratio),
}
STATISTICS = {
    "speed": "overall tokens/s of `{a}` ÷ `{b}`",
    "ppl": "perplexity of `{a}` ÷ `{b}`",
    "block": "block efficiency (tokens per target call) of `{a}` ÷ `{b}`",
    "energy": "J/token of `{b}` ÷ `{a}`",
    "memory": "mean peak memory of `{a}` ÷ `{b}`",
}


def compare(experiment: str, a: str, b: str, kind: str):
    keys, statistic = KINDS[kind]

    def measure(ctx: Context) -> tuple[Estimate, str, str]:
        xa, xb = ctx.paired(experiment, a, b, keys)
        n = xa.shape[1]
        if n == 0:
            raise ValueError(f"no prompt where both `{a}` and `{b}` finished in {experiment!r}")
        est = stats.paired_bootstrap(lambda *v: statistic(*v), *xa, *xb)
        exp = EXPERIMENTS[experiment]
        cause = _cause(kind, a, b, _summary(ctx.method_rows(experiment, a)), _summary(ctx.method_rows(experiment, b)))
        if kind == "memory":
            cause = f"{cause}: {xa[0].mean():.1f} MB vs {xb[0].mean():.1f} MB"
        return est, exp.setting(ctx.quick), cause

    return measure


def comparison(
    id, paper, text, paper_setting, paper_value, expected, direction, experiment, a, b, kind, energy=False
) -> Claim:
    if isinstance(expected, (int, float)):
        expected = (float(expected), float(expected))
    return Claim(
        id,
        paper,
        text,
        paper_setting,
        paper_value,
        expected,
        direction,
        1.0,
        "×",
        compare(experiment, a, b, kind),
        (experiment,),
        energy=energy or kind == "energy",
        statistic=STATISTICS[kind].format(a=a, b=b),
    )


# -- measures from the theory simulations -----------------------------------------------------------


def _simulated_over_exact(key: str):
    def measure(ctx: Context) -> tuple[Estimate, str, str]:
        th = ctx.theory["simulations"][key]
        runs = np.array(th["per_run"], dtype=float)
        exact = th["exact"]
        est = stats.paired_bootstrap(lambda r: r.mean() / exact, runs)
        s = ctx.theory["settings"]
        cause = f"exact E[rejections] {exact:.3f}, simulated mean {runs.mean():.3f} over {len(runs)} runs"
        if key.startswith("batch"):
            by_m = ctx.theory["batch_curve"]
            falls = all(x >= y - 1e-12 for x, y in zip(by_m["exact"], by_m["exact"][1:], strict=False))
            cause += (
                f"; exact values fall {'monotonically' if falls else 'NOT monotonically'} with M: "
                f"M=1 {by_m['exact'][0]:.3f}, M={by_m['M'][-1]} {by_m['exact'][-1]:.3f}, limit "
                f"{by_m['limit']:.3f}"
            )
        return (
            est,
            (
                f"random Markov chains, vocabulary {s['vocab']}, horizon {s['horizon']}, {len(runs)} runs of the "
                "library's decoder"
            ),
            cause,
        )

    return measure


def _front_distance(ctx: Context) -> tuple[Estimate, str, str]:
    """Mean over ε of (measured bias − the front's least bias at the measured rejection) for OPT. The bias is
    the sampled law's excess over the target on the tokens where the exact OPT law exceeds it: linear in the
    draws, so unbiased (the TV of an empirical law is biased upward by sampling noise)."""
    th = ctx.theory["sd_opt"]
    target = np.array(th["target"])
    points = [p for p in th["points"] if p["resample"] == "opt"]
    vocab = len(target)
    excess = [np.eye(vocab)[np.array(p["tokens"])][:, np.array(p["exact_law"]) > target] for p in points]
    rejected = [np.array(p["rejected"], dtype=float) for p in points]
    above = [target[np.array(p["exact_law"]) > target].sum() for p in points]

    def one(ex, rj, t_mass):
        return ex.mean(0).sum() - t_mass - max(th["tv"] - rj.mean(), 0.0)

    def distance(*cols):
        k = len(points)
        return float(np.mean([one(*c) for c in zip(cols[:k], cols[k:], above, strict=True)]))

    est = stats.paired_bootstrap(distance, *excess, *rejected)
    each = [one(*c) for c in zip(excess, rejected, above, strict=True)]
    cause = (
        "OPT points (bias − front): "
        + ", ".join(f"ε={p['eps']:g}: {d:+.3f}" for p, d in zip(points, each, strict=True))
        + "; UNO points lie "
        + ", ".join(
            f"{p['exact_bias'] - max(th['tv'] - p['exact_rejection'], 0):+.3f}"
            for p in th["points"]
            if p["resample"] == "uno"
        )
        + " above the front (exact)"
    )
    return est, f"one step, random 8-token pair (TV {th['tv']:.3f}), {len(rejected[0])} runs per ε", cause


def _bridge(ctx: Context) -> tuple[Estimate, str, str]:
    rows = [r for r in ctx.theory["bridge"]["rows"] if r["measured_acceptance"] is not None]
    if not rows:
        raise ValueError("no bridge prompt where sd drafted a token")
    pred = np.array([r["predicted_acceptance"] for r in rows])
    meas = np.array([r["measured_acceptance"] for r in rows])
    est = stats.paired_bootstrap(lambda m, p: m.mean() / p.mean(), meas, pred)
    tau_p = np.mean([r["predicted_tau_positional"] for r in rows])
    tau_m = np.mean([r["measured_tau"] for r in rows])
    b = ctx.theory["bridge"]
    return (
        est,
        (
            f"the real pair, {len(rows)} Spec-Bench dev prompts, sd γ={b['gamma']}, T={b['temperature']:g}, "
            f"{b['max_new_tokens']} tokens"
        ),
        (
            f"mean TV {np.mean([r['mean_tv'] for r in rows]):.3f}; acceptance predicted {pred.mean():.3f}, measured "
            f"{meas.mean():.3f}; block efficiency predicted {tau_p:.2f} (positional), measured {tau_m:.2f}"
        ),
    )


# -- the claims -------------------------------------------------------------------------------------

LLAMA13 = "Llama-2-13B / Llama-68M"
MCSD13 = "LLaMA-13B / LLaMA-68M, Alpaca, T=1"


def all_claims() -> list[Claim]:
    mt, mj, th, ds, mc = "MTAD", "MJSD", "theory", "DSBD", "MCSD"
    k20 = "top-k 20, top-p 0.9, T=1"
    return [
        comparison(
            "mtad.perplexity",
            mt,
            "perplexity about 21 % lower than target sampling",
            f"13B targets, 5 datasets, {k20}",
            "−21.2 % (0.79×)",
            0.788,
            -1,
            "joint",
            MTAD,
            "ar",
            "ppl",
        ),
        comparison(
            "mtad.speed_vs_sd",
            mt,
            "1.42× the speed of speculative sampling",
            f"13B targets, L40, {k20}",
            "1.42×",
            1.42,
            +1,
            "joint",
            MTAD,
            "sd:gamma=4",
            "speed",
        ),
        comparison(
            "mtad.tau_speed",
            mt,
            "speed falls as τ rises (Fig. 3)",
            f"{LLAMA13}, τ ∈ [0, 1]",
            "falls (curve only)",
            None,
            -1,
            "joint",
            "mtad:tau=0.9",
            "mtad:tau=0",
            "speed",
        ),
        comparison(
            "mtad.tau_perplexity",
            mt,
            "perplexity rises as τ → 1, where MTAD is target sampling (Fig. 3)",
            f"{LLAMA13}, τ ∈ [0, 1]",
            "rises (curve only)",
            None,
            +1,
            "joint",
            "mtad:tau=1",
            MTAD,
            "ppl",
        ),
        comparison(
            "mtad.energy",
            mt,
            "1.54× less energy per token than speculative sampling",
            "13B targets, L40",
            "1.54×",
            1.54,
            +1,
            "joint",
            MTAD,
            "sd:gamma=4",
            "energy",
        ),
        comparison(
            "mjsd.speed_vs_ar",
            mj,
            "about 2.2× target-only decoding",
            f"13B targets, 3 datasets, {k20}",
            "2.21× (1.87–2.79 over six settings)",
            (1.87, 2.79),
            +1,
            "joint",
            "mjsd",
            "ar",
            "speed",
        ),
        comparison(
            "mjsd.perplexity_vs_ar",
            mj,
            "lower perplexity than target-only decoding",
            f"13B targets, 3 datasets, {k20}",
            "−27.7 % (0.72×)",
            0.723,
            -1,
            "joint",
            "mjsd",
            "ar",
            "ppl",
        ),
        comparison(
            "mjsd.speed_vs_bild",
            mj,
            "faster than BiLD",
            f"13B targets, 3 datasets, {k20}",
            "1.55× (1.29–1.83)",
            (1.29, 1.83),
            +1,
            "joint",
            "mjsd",
            "bild",
            "speed",
        ),
        comparison(
            "mjsd.perplexity_vs_bild",
            mj,
            "lower perplexity than BiLD",
            f"13B targets, 3 datasets, {k20}",
            "−19.6 % (0.80×)",
            0.804,
            -1,
            "joint",
            "mjsd",
            "bild",
            "ppl",
        ),
        comparison(
            "mjsd.energy_vs_ar",
            mj,
            "about 2.8× less energy per token than target-only decoding",
            "13B targets",
            "2.84× (2.35–3.66)",
            (2.35, 3.66),
            +1,
            "joint",
            "mjsd",
            "ar",
            "energy",
        ),
        Claim(
            "theory.sd_rejections",
            th,
            "sd's expected rejections equal the sum of TV distances (Theorem 1)",
            "random non-stationary chains",
            "equal (theorem)",
            None,
            0,
            1.0,
            "×",
            _simulated_over_exact("sd"),
            theory=True,
            statistic="simulated mean rejections ÷ exact Σ TV",
        ),
        Claim(
            "theory.batch_rejections",
            th,
            "batch SD's rejections fall with M to the computed limit (Theorem 3, Proposition 1)",
            "random non-stationary chains",
            "equal to the exact value (theorem)",
            None,
            0,
            1.0,
            "×",
            _simulated_over_exact("batch"),
            theory=True,
            statistic="simulated mean rejections of batch-sd at the largest M ÷ exact",
        ),
        Claim(
            "theory.sd_opt_front",
            th,
            "the optimal over-acceptance (OPT) lies on the rejection/bias Pareto front (Theorem 5)",
            "one step, random pair",
            "on the front (theorem)",
            None,
            0,
            0.0,
            "",
            _front_distance,
            theory=True,
            statistic="mean over ε of measured bias − the front's bias at the measured rejection",
            margin=0.02,
        ),
        Claim(
            "theory.bridge",
            th,
            "acceptance is 1 − TV along the target's samples (Theorem 1 on a real pair)",
            "no real-pair experiment in the paper",
            "equal (theory)",
            None,
            0,
            1.0,
            "×",
            _bridge,
            theory=True,
            statistic="measured sd acceptance ÷ predicted (1 − mean TV)",
            margin=0.10,
        ),
        comparison(
            "dsbd.speed_vs_beam",
            ds,
            "1.5–1.9× faster than beam sampling at equal quality",
            "SQuAD/Spider, Llama-2/3 and OPT, top-k 10, top-p 0.8",
            "1.5–1.9×",
            (1.5, 1.9),
            +1,
            "dsbd",
            "dsbd",
            "beam:width=3",
            "speed",
        ),
        comparison(
            "dsbd.perplexity_vs_beam",
            ds,
            "at equal quality (read off the Pareto fronts)",
            "SQuAD/Spider, top-k 10, top-p 0.8",
            "equal",
            None,
            0,
            "dsbd",
            "dsbd",
            "beam:width=3",
            "ppl",
        ),
        comparison(
            "dsbd.energy_vs_beam",
            ds,
            "1.8–2.5× less energy than beam sampling",
            "SQuAD/Spider",
            "1.8–2.5×",
            (1.8, 2.5),
            +1,
            "dsbd",
            "dsbd",
            "beam:width=3",
            "energy",
        ),
        comparison(
            "dsbd.memory_one_cache",
            ds,
            "the one-KV-cache variant needs the memory of one sequence, less than beam's W",
            "Llama-2, memory-constrained comparison (Table 2)",
            "less (one sequence vs W)",
            None,
            -1,
            "dsbd",
            "dsbd:one_cache=true",
            "beam:width=3",
            "memory",
        ),
        comparison(
            "dsbd.dynamic_vs_fixed",
            ds,
            "a dynamic width (t > 0) is faster than the fixed width W_S",
            "Fig. 8, t ∈ {0.7, 0.9}",
            "faster (curves only)",
            None,
            +1,
            "dsbd",
            "dsbd",
            "dsbd:width_threshold=0",
            "speed",
        ),
        comparison(
            "mcsd.block_vs_sd",
            mc,
            "block efficiency above sd's at equal depth (without replacement)",
            f"{MCSD13}, 4x2x2 vs sd γ=3",
            "2.45 vs 1.93 (1.27×)",
            2.45 / 1.93,
            +1,
            "mcsd-alpaca",
            "mcsd:k_config=4x2x2",
            "sd:gamma=3",
            "block",
        ),
        comparison(
            "mcsd.block_vs_sd_replacement",
            mc,
            "block efficiency above sd's at equal depth (with replacement)",
            f"{MCSD13}, 4x2x2 vs sd γ=3",
            "2.39 vs 1.93 (1.24×)",
            2.39 / 1.93,
            +1,
            "mcsd-alpaca",
            "mcsd:k_config=4x2x2,replacement=true",
            "sd:gamma=3",
            "block",
        ),
        comparison(
            "mcsd.block_vs_sd_wmt",
            mc,
            "block efficiency above sd's at equal depth on WMT",
            "LLaMA-13B / LLaMA-68M, WMT, T=1, 8x2 vs sd γ=2",
            "1.95 vs 1.55 (1.26×)",
            1.95 / 1.55,
            +1,
            "mcsd-wmt",
            "mcsd:k_config=8x2",
            "sd:gamma=2",
            "block",
        ),
        comparison(
            "mcsd.speedup",
            mc,
            "speed-up over target-only decoding (up to 3.06× over all settings)",
            f"{MCSD13}, 4x2x2, A100",
            "1.91× (up to 3.06×)",
            1.91,
            +1,
            "mcsd-alpaca",
            "mcsd:k_config=4x2x2",
            "ar",
            "speed",
        ),
        comparison(
            "mcsd.speedup_wmt",
            mc,
            "speed-up over target-only decoding on WMT",
            "LLaMA-13B / LLaMA-68M, WMT, T=1, 8x2, A100",
            "1.57×",
            1.57,
            +1,
            "mcsd-wmt",
            "mcsd:k_config=8x2",
            "ar",
            "speed",
        ),
        comparison(
            "mcsd.tree_attention",
            mc,
            "without tree attention the same tree is slower (τ unchanged)",
            f"{MCSD13}, 4x2x2 (Table 4)",
            "1.61× vs 1.91× (0.84×)",
            1.61 / 1.91,
            -1,
            "mcsd-alpaca",
            "mcsd:k_config=4x2x2,tree_attention=false",
            "mcsd:k_config=4x2x2",
            "speed",
        ),
        comparison(
            "mcsd.mcss_vs_mcns",
            mc,
            "MCSS accepts far more than naive multi-candidate sampling (MCNS)",
            f"{MCSD13}, 4x2x2 (Table 4)",
            "2.45 vs 1.52 (1.61×)",
            2.45 / 1.52,
            +1,
            "mcsd-alpaca",
            "mcsd:k_config=4x2x2",
            "mcsd:k_config=4x2x2,verifier=naive",
            "block",
        ),
        comparison(
            "mcsd.vs_specinfer",
            mc,
            "MCSD (drafts without replacement) accepts at least as much as SpecInfer's verifier on the same tree",
            f"{MCSD13}: SpecInfer's verifier not run; Table 4's with/without-replacement gap",
            "≥ (2.45 vs 2.39 for i.i.d. drafts)",
            None,
            +1,
            "mcsd-alpaca",
            "mcsd:k_config=4x2x2",
            "specinfer:k_config=4x2x2",
            "block",
        ),
    ]


PAPERS = {"MTAD": "mtad", "MJSD": "mjsd", "theory": "theory", "DSBD": "dsbd", "MCSD": "mcsd"}


def select(names: list[str] | None) -> list[Claim]:
    """Claims by paper ("mtad") or id ("mcsd.speedup"); all by default."""
    claims = all_claims()
    if not names:
        return claims
    known = {c.id for c in claims} | set(PAPERS.values())
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(
            f"unknown claim {bad[0]!r}; give a paper ({', '.join(PAPERS.values())}) or a claim id "
            f"({', '.join(c.id for c in claims)})"
        )
    return [c for c in claims if c.id in names or PAPERS[c.paper] in names]
