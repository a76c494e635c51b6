"""Paired bootstrap intervals over prompts, and the verdict rule of the reproduction report.

Glossary:
- a *statistic* maps arrays of per-prompt values (one array per measured quantity, the same prompts in the
  same order) to one number, such as the ratio of two methods' overall tokens per second;
- *paired*: a resample draws prompt indices once and applies them to every array, so that each prompt's
  rows for the two methods stay together (same prompt, same seed);
- the interval is the percentile interval of the statistic over `resamples` resamples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

RESAMPLES = 4000
LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    value: float  # the statistic on the prompts as measured
    low: float
    high: float
    n: int  # prompts (or simulated runs) it rests on


def paired_bootstrap(
    statistic: Callable[..., float], *arrays, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0
) -> Estimate:
    """`statistic(*arrays)` on the data, with a `level` percentile interval from resampling the shared index.
    Each array is [n] or [n, ...]; the statistic must accept the same shapes with the first axis resampled."""
    data = [np.asarray(a, dtype=float) for a in arrays]
    n = len(data[0])
    if n == 0 or any(len(a) != n for a in data):
        raise ValueError("paired bootstrap needs arrays of one non-zero length")
    value = float(statistic(*data))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    draws = np.array([statistic(*(a[i] for a in data)) for i in idx], dtype=float)
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return Estimate(value, float("nan"), float("nan"), n)
    lo, hi = np.percentile(draws, [50 * (1 - level), 50 * (1 + level)])
    return Estimate(value, float(lo), float(hi), n)


# -- statistics on per-prompt arrays (a: the method, b: what it is compared with) -------------------


def throughput_ratio(tokens_a, seconds_a, tokens_b, seconds_b) -> float:
    """Overall tokens per second of a over that of b (total tokens / total time, as the papers report)."""
    return (tokens_a.sum() / seconds_a.sum()) / (tokens_b.sum() / seconds_b.sum())


def perplexity_ratio(logp_a, logp_b) -> float:
    """exp(-mean log p) of a over that of b: the perplexity the bench reports, mean over prompts of each
    output's mean token log-probability under the target."""
    return float(np.exp(logp_b.mean() - logp_a.mean()))


def per_call_ratio(tokens_a, calls_a, tokens_b, calls_b) -> float:
    """Block efficiency (tokens per target call) of a over that of b."""
    return (tokens_a.sum() / calls_a.sum()) / (tokens_b.sum() / calls_b.sum())


def saving_ratio(joules_a, tokens_a, joules_b, tokens_b) -> float:
    """How many times less energy per token a uses than b (b's J/token over a's)."""
    return (joules_b.sum() / tokens_b.sum()) / (joules_a.sum() / tokens_a.sum())


def mean_ratio(a, b) -> float:
    return a.mean() / b.mean()


# -- verdicts -------------------------------------------------------------------------------------

REPRODUCED, DIRECTION, NOT = "reproduced", "direction only", "not reproduced"


def verdict(
    est: Estimate, null: float, direction: int, expected: tuple[float, float] | None, margin: float = 0.05
) -> str:
    """direction +1: the paper says the statistic is above `null` (no effect), -1 below, 0 equal to it.
    *reproduced*: the interval lies on the paper's side of `null` and reaches the paper's value (or range,
    `expected`); *direction only*: on the paper's side but not reaching it; *not reproduced*: the interval
    holds `null` or lies on the other side. An equality claim is reproduced when the interval holds `null`."""
    lo, hi = est.low, est.high
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return NOT
    if direction == 0:
        return REPRODUCED if null - margin <= lo and hi <= null + margin else NOT
    if not (lo > null if direction > 0 else hi < null):
        return NOT
    if expected is None:
        return REPRODUCED
    return REPRODUCED if lo <= expected[1] and hi >= expected[0] else DIRECTION
