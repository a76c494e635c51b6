"""Run the real decoders on Markov chain pairs and count their rejections, to set beside the exact values.

The decoders are the library's own (`generate` with `MarkovLM` models), run with unlimited lookahead
(gamma = horizon) and no bonus token, the setting of Theorem 1.
"""

from __future__ import annotations

import numpy as np

from ...api import generate
from ...models.markov import MarkovLM


def rejections_per_run(
    draft: np.ndarray,
    target: np.ndarray,
    runs: int,
    method: str = "sd",
    seed: int = 0,
    mu0: np.ndarray | None = None,
    **params,
) -> np.ndarray:
    """N_rej of each of `runs` generations of the whole horizon; prompts x0 ~ mu0 (uniform by default)."""
    horizon, vocab = draft.shape[0], draft.shape[-1]
    draft_lm, target_lm = MarkovLM(draft, name="draft"), MarkovLM(target, name="target")
    rng = np.random.default_rng(seed)
    starts = rng.choice(vocab, size=runs, p=mu0)
    params = {"gamma": horizon, "bonus": False, **params}
    out = np.empty(runs)
    for r in range(runs):
        res = generate(
            target_lm,
            draft_lm,
            [int(starts[r])],
            method=method,
            max_new_tokens=horizon,
            seed=seed * 1_000_003 + r,
            score=False,
            **params,
        )
        out[r] = res.stats["rejections"]
    return out


def running_mean(values: np.ndarray) -> np.ndarray:
    return np.cumsum(values) / np.arange(1, len(values) + 1)


def first_token_draws(
    draft_row: np.ndarray, target_row: np.ndarray, runs: int, method: str, seed: int = 0, **params
) -> tuple[np.ndarray, np.ndarray]:
    """The emitted token and whether the draft was rejected, per run, for context-free rows."""
    vocab = len(draft_row)
    draft_lm = MarkovLM(np.tile(draft_row, (vocab, 1)), name="draft")
    target_lm = MarkovLM(np.tile(target_row, (vocab, 1)), name="target")
    tokens, rejected = np.empty(runs, dtype=int), np.empty(runs)
    for r in range(runs):
        res = generate(
            target_lm,
            draft_lm,
            [0],
            method=method,
            max_new_tokens=1,
            seed=seed * 1_000_003 + r,
            gamma=1,
            bonus=False,
            score=False,
            **params,
        )
        tokens[r], rejected[r] = res.token_ids[0], res.stats["rejections"]
    return tokens, rejected


def first_token_law(
    draft_row: np.ndarray, target_row: np.ndarray, runs: int, method: str, seed: int = 0, **params
) -> tuple[np.ndarray, float]:
    """Empirical law of one emitted token and the rejection frequency, for context-free rows."""
    tokens, rejected = first_token_draws(draft_row, target_row, runs, method, seed, **params)
    return np.bincount(tokens, minlength=len(draft_row)) / runs, float(rejected.mean())
