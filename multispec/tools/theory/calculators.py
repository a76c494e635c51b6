"""Exact calculators for the theory of speculative decoding (Yin et al., NeurIPS 2024).

Instances are non-stationary Markov chain pairs given as arrays of shape [T, V, V]:
draft[n][x, y] = P_draft(x_{n+1} = y | x_n = x) and likewise for the target, n = 0..T-1, with a prompt
law mu0 over V. (Seed 002 writes p for the draft and q for the target; the names here say which.)
Everything is float64 NumPy; loops are O(T V^2 M).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def tv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Total-variation distance along the last axis: sum max(a - b, 0)."""
    return np.clip(np.asarray(a) - np.asarray(b), 0, None).sum(-1)


def uniform_rows(rng: np.random.Generator, horizon: int, vocab: int) -> np.ndarray:
    """Rows u / sum(u), u ~ Uniform[0, 1]^V: the generator that reproduces the paper's E[N_rej] ~ 16.41."""
    u = rng.uniform(size=(horizon, vocab, vocab))
    return u / u.sum(-1, keepdims=True)


@dataclass
class Rejections:
    total: float  # expected number of rejections E[N_rej]
    per_position: np.ndarray  # [T] expected rejection at each position (the increments)

    @property
    def expected_calls(self) -> float:
        """Target calls with unlimited lookahead: 1 + E[N_rej] - P(R_T = 1)."""
        return 1.0 + self.total - float(self.per_position[-1])

    def acceleration(self, horizon: int) -> float:
        """The paper's acceleration rate T / E[N_rej]."""
        return horizon / self.total if self.total > 0 else float("inf")


def _check(draft: np.ndarray, target: np.ndarray, mu0: np.ndarray | None):
    draft, target = np.asarray(draft, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if draft.shape != target.shape or draft.ndim != 3 or draft.shape[1] != draft.shape[2]:
        raise ValueError(f"draft and target must both have shape [T, V, V]; got {draft.shape} and {target.shape}")
    v = draft.shape[-1]
    mu0 = np.full(v, 1.0 / v) if mu0 is None else np.asarray(mu0, dtype=np.float64)
    if mu0.shape != (v,):
        raise ValueError(f"mu0 must have shape ({v},), got {mu0.shape}")
    return draft, target, mu0


def sd_rejections(draft, target, mu0=None) -> Rejections:
    """Theorem 1: E[N_rej] of speculative decoding = sum_n E_{prefix ~ target}[TV(draft_n, target_n)]."""
    draft, target, mu = _check(draft, target, mu0)
    inc = np.empty(draft.shape[0])
    for n in range(draft.shape[0]):
        inc[n] = mu @ tv(draft[n], target[n])
        mu = mu @ target[n]
    return Rejections(float(inc.sum()), inc)


def batch_first_token(draft_rows: np.ndarray, target_rows: np.ndarray, m: int | float):
    """All-M-rejected mass rho and the unnormalised final residual g for M i.i.d. first-token candidates
    (the stable loop of Yin et al., 2024, §3.3), row-wise. m = inf gives the limit of Proposition 1, which needs
    no support assumption: rho = target mass outside supp(draft)."""
    if np.isinf(m):
        g = np.where(draft_rows == 0, target_rows, 0.0)
        return g.sum(-1), g
    r = np.array(target_rows, dtype=np.float64)
    big_r = np.ones(r.shape[:-1])
    for _ in range(int(m)):
        r = np.clip(r - big_r[..., None] * draft_rows, 0, None)
        big_r = r.sum(-1)
    return big_r, r


def batch_rejections(draft, target, m: int | float, mu0=None) -> Rejections:
    """Theorem 3: expected rejections of batch SD with M i.i.d. draft responses (M = inf: Proposition 1).

    f(x_{1:n}) = P(prefix and the n-th token was rejected) is carried per last token (F); a position is
    a batch start with probability F, where all M first tokens are rejected with probability rho, and
    otherwise continues one response, where the rejection probability is the SD value TV.
    """
    if not (np.isinf(m) or (float(m).is_integer() and m >= 1)):
        raise ValueError(f"the batch size M must be an integer >= 1 or inf, got {m!r}")
    draft, target, mu = _check(draft, target, mu0)
    f = mu.copy()  # f(empty prefix) = 1: the first position is a batch start
    inc = np.empty(draft.shape[0])
    for n in range(draft.shape[0]):
        rho, g = batch_first_token(draft[n], target[n], m)
        h = np.clip(target[n] - draft[n], 0, None)
        tvn = tv(draft[n], target[n])
        inc[n] = f @ rho + (mu - f) @ tvn
        f = f @ g + (mu - f) @ h
        mu = mu @ target[n]
    return Rejections(float(inc.sum()), inc)


# ---- single-step trade-off between rejection and bias (Theorems 4 and 5) -----------------------------


def relaxed_acceptance(draft: np.ndarray, target: np.ndarray, eps: float) -> np.ndarray:
    """b_eps(x) = min(1, (target(x) + eps) / draft(x)); eps = 0 is SD's rule (1 where the draft is 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        b = np.where(draft > 0, (target + eps) / np.where(draft > 0, draft, 1), 1.0)
    return np.minimum(b, 1.0)


def rejection(b: np.ndarray, draft: np.ndarray) -> float:
    return float(((1 - b) * draft).sum())


def optimal_resampling(b: np.ndarray, draft: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Theorem 4: P* = norm([target - b * draft]_+)."""
    a = np.clip(target - b * draft, 0, None)
    return a / a.sum() if a.sum() > 0 else target.copy()


def loss_star(b: np.ndarray, draft: np.ndarray, target: np.ndarray) -> float:
    """Theorem 4: the least bias TV(P^A, target) any resampling distribution achieves with rule b."""
    return float(np.clip(b * draft - target, 0, None).sum())


def loss_of(b: np.ndarray, resampling: np.ndarray, draft: np.ndarray, target: np.ndarray) -> float:
    """Bias of the template algorithm (b, P): TV(b * draft + rej * P, target)."""
    law = b * draft + rejection(b, draft) * resampling
    return float(tv(law, target))


def pareto(rej: np.ndarray | float, tv_value: float) -> np.ndarray:
    """Theorem 5: least achievable bias at a given rejection probability, max(TV - rej, 0)."""
    return np.maximum(tv_value - np.asarray(rej), 0.0)


def tradeoff_curve(draft: np.ndarray, target: np.ndarray, eps: np.ndarray) -> dict[str, np.ndarray]:
    """Rejection, Decoding-OPT bias and Decoding-UNO bias of b_eps over a grid of eps."""
    rej, opt, uno = [], [], []
    for e in eps:
        b = relaxed_acceptance(draft, target, float(e))
        rej.append(rejection(b, draft))
        opt.append(loss_of(b, optimal_resampling(b, draft, target), draft, target))
        uno.append(loss_of(b, target, draft, target))
    return {
        "eps": np.asarray(eps, dtype=float),
        "rejection": np.array(rej),
        "loss_opt": np.array(opt),
        "loss_uno": np.array(uno),
        "tv": float(tv(draft, target)),
    }
