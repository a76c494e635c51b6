"""Logit warping: temperature, top-k, top-p. Draft and target always share one `Sampling`.

Probabilities are computed in float32 at least (float64 stays float64), whatever the model dtype,
so that ratios and residuals of verification are not spoiled by half-precision underflow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        t, k, p = self.temperature, self.top_k, self.top_p
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {t!r}")
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 turns it off), got {k!r}")
        if not isinstance(p, (int, float)) or math.isnan(p) or not 0 < p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def draw(self, probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One token per row of warped `probs`: the argmax when greedy, else a draw with `generator`."""
        if self.greedy:
            return argmax(probs)
        return categorical(probs, generator)

    def next_token(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """`draw(probs(logits))` where the distributions themselves are not needed: greedy takes the logits'
        argmax (the same first maximum) without building one-hot rows."""
        if self.greedy:
            return argmax(logits)
        return self.draw(self.probs(logits), generator)

    def probs_and_token(self, logits: torch.Tensor, generator: torch.Generator | None = None):
        """(`probs(logits)`, `draw` from them), with one argmax when greedy instead of two."""
        if self.greedy:
            token = argmax(logits)
            return one_hot(token, logits), token
        probs = self.probs(logits)
        return probs, self.draw(probs, generator)

    def rows(self, logits: torch.Tensor) -> LazyRows:
        """`probs(logits)` for logits [n, V], one row at a time on first use (`LazyRows`)."""
        return LazyRows(logits.shape[0], lambda i: self.probs(logits[i]))

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped next-token distributions over the last axis. Greedy gives one-hot rows."""
        if self.greedy:
            return one_hot(argmax(logits), logits)
        logits = logits.to(_float(logits))
        z = logits / self.temperature if self.temperature != 1 else logits  # x / 1 is x: one pass saved
        z = _top_k(z, self.top_k)
        z = _top_p(z, self.top_p)
        return torch.softmax(z, dim=-1)


class LazyRows:
    """Probability rows [n, V], each made on first use (`rows[i]`, a [V] tensor): a rule that walks rows in order
    and stops at a rejection never makes the rows after it (sd's target rows past the first rejection, one pass
    over the vocabulary each), and rows made one by one need not be copied into one tensor. `stacked()`: all of
    them as one [n, V] tensor."""

    def __init__(self, count: int, make: Callable[[int], torch.Tensor]):
        self._made: list[torch.Tensor | None] = [None] * count
        self._make = make

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, i: int) -> torch.Tensor:
        row = self._made[i]
        if row is None:
            row = self._made[i] = self._make(i)
        return row

    def stacked(self) -> torch.Tensor:
        return torch.stack([self[i] for i in range(len(self))])


def argmax(t: torch.Tensor) -> torch.Tensor:
    """`t.argmax(-1)`: the first maximum of each row (a NaN counts as the maximum), as long. On a CPU, numpy's
    argmax for float32 / float64 rows: torch's CPU argmax scans a row one entry at a time, numpy's is
    vectorised (measured with benchmarks/iteration_work.py)."""
    if t.device.type != "cpu" or t.dtype not in (torch.float32, torch.float64) or t.dim() == 0 or t.requires_grad:
        return t.argmax(-1)
    return torch.from_numpy(np.asarray(t.numpy().argmax(-1), dtype=np.int64))


# `largest` finds up to this many entries by repeated argmax passes; more go to torch.topk
LARGEST_BY_ARGMAX = 8


def largest(t: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row of `t` [..., V], largest first (ties: the lower index first; a NaN
    counts as the largest): (values, indices [..., k] long), as `torch.topk(t, k)`. On a CPU, for float rows
    and small k, k vectorised argmax passes over the rows: several times faster than torch's CPU topk over a
    large vocabulary (measured with benchmarks/iteration_work.py)."""
    if (
        t.device.type != "cpu"
        or t.dtype not in (torch.float32, torch.float64)
        or t.requires_grad
        or not 0 < k <= min(LARGEST_BY_ARGMAX, t.shape[-1])
    ):
        return torch.topk(t, k, dim=-1)
    rows = t.numpy().reshape(-1, t.shape[-1])
    work = rows.copy() if k > 1 else rows
    picked = np.empty((rows.shape[0], k), dtype=np.int64)
    every = np.arange(rows.shape[0])
    for j in range(k):
        picked[:, j] = work.argmax(-1)
        if j + 1 < k:
            work[every, picked[:, j]] = -np.inf
    if k > 1 and not np.diff(np.sort(picked, 1), axis=1).all():
        return torch.topk(t, k, dim=-1)  # a row with fewer than k entries above -inf: an index came back twice
    shape = (*t.shape[:-1], k)
    return torch.from_numpy(rows[every[:, None], picked]).reshape(shape), torch.from_numpy(picked).reshape(shape)


def _float(t: torch.Tensor) -> torch.dtype:
    """The dtype probabilities are computed in: float32 at least, float64 stays float64."""
    return t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float32


def one_hot(token: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Rows [*token.shape, V] (V: `like`'s last axis), in `like`'s probability dtype and on `token`'s device,
    with 1 at each `token`."""
    rows = torch.zeros(*token.shape, like.shape[-1], dtype=_float(like), device=token.device)
    return rows.scatter_(-1, token.unsqueeze(-1), 1.0)


def categorical(
    probs: torch.Tensor, generator: torch.Generator | None = None, samples: int | None = None
) -> torch.Tensor:
    """One draw per row of `probs` [..., V] (weights, need not sum to 1), by inverting the cumulative sum at
    a uniform: the law of `torch.multinomial(probs, 1)`, for one uniform per row instead of one random number
    per vocabulary entry (13x faster for one draw over 49k tokens here). A zero-weight token is never drawn.
    `samples`: that many i.i.d. draws per row instead, [..., samples] (`multinomial(..., replacement=True)`'s
    law; torch draws one random number per entry when it is asked for one sample)."""
    rows = probs.reshape(-1, probs.shape[-1])
    uniforms = torch.rand(rows.shape[0], samples or 1, generator=generator, device=probs.device, dtype=torch.float64)
    index = _draw_at(rows, uniforms)
    return index.reshape(probs.shape[:-1]) if samples is None else index.reshape(*probs.shape[:-1], samples)


def categorical_each(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One draw per row of `probs` [B, V] (weights), row b's from `generators[b]`: for each row, the token
    `categorical(probs[b], generators[b])` draws, from the same uniform, the rows inverted together.

    Returns: [B] token ids."""
    if len(generators) != probs.shape[0]:
        raise ValueError(f"{len(generators)} generators for {probs.shape[0]} rows")
    # one float64 uniform per row from its own stream (what `categorical` draws for one row): each row's draw
    # depends on its own generator only, so a row's tokens do not depend on which rows it is drawn with
    uniforms = torch.cat([torch.rand(1, 1, generator=g, device=probs.device, dtype=torch.float64) for g in generators])
    return _draw_at(probs, uniforms).reshape(-1)


def _draw_at(rows: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The tokens at `uniforms` [n, s] of the cumulative weights of `rows` [n, V]: [n, s]."""
    cdf = rows.double().cumsum(-1)  # float64: the law is not bent by rounding over a large vocabulary
    # (few, plain tensor calls: on a CPU each costs microseconds, more than the arithmetic on small rows)
    total = cdf.narrow(-1, rows.shape[-1] - 1, 1)
    if not all(math.isfinite(t) and t > 0 for t in total.view(-1).tolist()):
        raise ValueError("cannot draw from weights that are not finite or sum to zero")
    point = uniforms.mul_(total)
    # right=True: the first token whose cumulative weight exceeds the point, which has weight > 0
    index = torch.searchsorted(cdf, point, right=True).clamp_max_(rows.shape[-1] - 1)
    if not bool(rows.gather(-1, index).gt(0).all()):  # u * total rounded up to the total: take the last token
        last = rows.shape[-1] - 1 - (rows > 0).flip(-1).int().argmax(-1, keepdim=True)
        index = torch.where(rows.gather(-1, index) > 0, index, last)
    return index


# Draws without replacement from at most this many CPU float rows run in numpy (`_sequential_numpy`): the same
# law and uniforms as the torch path, one cumulative sum per row for all k draws (the torch path zeroes and sums
# again per draw: k passes over the rows, 8 over 8 x 49k entries for MTAD's beams). The sums stay torch's (its
# float64 cumsum ran ~2.5x faster than numpy's), and single draws (`categorical`) stay in torch: in numpy they
# ran ~20 % slower.
NUMPY_ROWS = 8


def _few_numpy_rows(rows: torch.Tensor) -> bool:
    return (
        rows.device.type == "cpu"
        and rows.dtype in (torch.float32, torch.float64)
        and not rows.requires_grad
        and 0 < rows.shape[0] <= NUMPY_ROWS
        and rows.shape[-1] > 0
    )


def sequential_draws(weights: torch.Tensor, k: int, generator: torch.Generator | None = None):
    """Up to k indices per row of `weights` [n, V], drawn one after another without replacement, each from the
    weights the row has left, in draw order: the law of `torch.multinomial(weights, k, replacement=False)`,
    for one uniform per draw instead of one random number per entry.
    Returns (indices [n, m], live [n, m] bool), m = min(k, V); a draw past a row's support is not live (its
    index is then meaningless)."""
    if _few_numpy_rows(weights) and weights.dim() == 2:
        return _sequential_numpy(weights, k, generator)
    full = weights.double()
    left = full.clone()
    columns, alive = [], []
    for _ in range(min(k, weights.shape[-1])):
        live = left.sum(-1) > 0  # [n]: rows whose support is used up draw from their full row, not live
        if not bool(live.any()):
            break
        drawn = categorical(torch.where(live[:, None], left, full), generator)  # [n]
        columns.append(drawn)
        alive.append(live)
        left.scatter_(-1, drawn[:, None], 0.0)
    return torch.stack(columns, 1), torch.stack(alive, 1)


def _sequential_numpy(weights: torch.Tensor, k: int, generator: torch.Generator | None):
    """`sequential_draws` on few CPU float rows [n, V]: one cumulative sum per row, whatever k is. The draw
    from what a row has left inverts C(i) - S(i), C the row's cumulative sum and S(i) the drawn weights at or
    before i (`_past_drawn`). Same uniforms as the torch path, one per row and draw."""
    rows = weights.to(torch.float64)
    held = rows.numpy()
    cdf = rows.cumsum(-1).numpy()
    n, vocab = held.shape
    total = cdf[:, -1]
    if not (np.isfinite(total).all() and (total > 0).all()):
        raise ValueError("cannot draw from weights that are not finite or sum to zero")
    support = (held > 0).sum(-1)
    m = min(k, vocab)
    columns, alive = np.zeros((n, m), dtype=np.int64), np.zeros((n, m), dtype=bool)
    taken = np.zeros(n)  # drawn weight per row
    for j in range(m):
        live = support > j  # rows whose support is used up draw from their full row, not live
        if not live.any():
            columns, alive = columns[:, :j], alive[:, :j]
            break
        uniform = torch.rand(n, 1, generator=generator, dtype=torch.float64).numpy()[:, 0]
        for r in range(n):
            if not live[r]:
                columns[r, j] = _invert(held[r], cdf[r], uniform[r] * total[r])
                continue
            drawn = columns[r, :j]
            index = _past_drawn(
                partial(_invert, held[r], cdf[r]), uniform[r] * (total[r] - taken[r]), drawn, held[r, drawn]
            )
            if (drawn == index).any():  # a rounding boundary: draw from the row as left
                left = held[r].copy()
                left[drawn] = 0.0
                index = _invert(left, np.cumsum(left), uniform[r] * left.sum())
            columns[r, j] = index
            alive[r, j] = True
            taken[r] += held[r, index]
    return torch.from_numpy(columns), torch.from_numpy(alive)


def draws_by_rows(
    rows: torch.Tensor, mass: torch.Tensor, k: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """k flat indices b * V + v drawn one after another without replacement from the weights mass[b] * rows[b, v]
    (rows [B, V], CPU float; mass [B]), in draw order: `sequential_draws` on those weights flattened into one row,
    with the same uniforms, but with a cumulative sum only of the rows that draws land in, not of all B x V
    entries (MTAD's beams: 8 x 49k per depth). A point is placed among the rows by their totals, then inverted
    in its row's own sum. k must not exceed the number of entries of weight > 0."""
    held = rows.numpy()
    share = mass.double().numpy()
    n, vocab = held.shape
    widths = share * rows.sum(-1, dtype=torch.float64).numpy()  # [B] each row's part of the flattened sum
    ends = np.cumsum(widths)
    total = float(ends[-1])
    if not (math.isfinite(total) and total > 0):
        raise ValueError("cannot draw from weights that are not finite or sum to zero")
    sums: dict[int, np.ndarray] = {}

    def locate(point: float) -> int:
        b = int(np.searchsorted(ends, point, side="right"))
        if b >= n or widths[b] <= 0:  # rounding put the point at or past the end: the last entry of weight > 0
            b = n - 1 - int(np.argmax(widths[::-1] > 0))
            point = math.inf
        if b not in sums:
            sums[b] = torch.cumsum(rows[b], 0, dtype=torch.float64).numpy()
        start = float(ends[b - 1]) if b else 0.0
        return b * vocab + _invert(held[b], sums[b], (point - start) / share[b])

    picks: list[int] = []
    weights: list[float] = []  # the drawn entries' weights
    taken = 0.0
    for _ in range(k):
        uniform = float(torch.rand(1, 1, generator=generator, dtype=torch.float64))
        index = _past_drawn(locate, uniform * (total - taken), np.array(picks, dtype=np.int64), np.array(weights))
        if index in picks:  # a rounding boundary: draw from the weights as left
            left = (rows.double() * mass.double()[:, None]).reshape(-1).numpy()
            left[picks] = 0.0
            index = _invert(left, np.cumsum(left), uniform * left.sum())
        b, v = divmod(index, vocab)
        picks.append(index)
        weights.append(float(share[b]) * float(held[b, v]))
        taken += weights[-1]
    return torch.tensor(picks, dtype=torch.long)


def _past_drawn(locate: Callable[[float], int], point: float, drawn: np.ndarray, drawn_weight: np.ndarray) -> int:
    """Where a draw from the weights left after the entries `drawn` (with weights `drawn_weight`) lands at
    `point` (a uniform times the weight left): `locate(x)` inverts the full weights' cumulative sum C at x, and
    the draw inverts C(i) - S(i), S(i) the drawn weight at or before i, by moving the point past S of the found
    index until S stops growing (at most one search per drawn entry). Rounding may still land it on a drawn
    entry: the caller checks."""
    index, shift = locate(point), 0.0
    while True:
        new = float(drawn_weight[drawn <= index].sum())
        if new == shift:
            return index
        shift, index = new, locate(point + new)


def _invert(row: np.ndarray, cdf: np.ndarray, point: float) -> int:
    """The first index whose cumulative weight exceeds `point` (right-sided: it has weight > 0), or the last
    index of weight > 0 when rounding puts the point at or past the end."""
    index = int(np.searchsorted(cdf, point, side="right"))
    if index >= row.shape[0] or row[index] <= 0:
        index = row.shape[0] - 1 - int(np.argmax(row[::-1] > 0))
    return index


def draw_without_replacement(weights: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """k indices of `weights` [V] drawn without replacement, in draw order (`sequential_draws` on one row)."""
    if k > int((weights > 0).sum()):
        raise ValueError(f"cannot draw {k} distinct indices from {int((weights > 0).sum())} with weight > 0")
    return sequential_draws(weights[None], k, generator)[0][0]


def _top_k(z: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= z.shape[-1]:
        return z
    kth = torch.topk(z, k, dim=-1).values[..., -1:]
    return z.masked_fill(z < kth, -math.inf)  # ties with the k-th value are kept


def _top_p(z: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest top set whose mass reaches p (the crossing token is kept; HF semantics)."""
    if p >= 1.0:
        return z
    sorted_z, order = torch.sort(z, dim=-1, descending=True)
    sorted_p = torch.softmax(sorted_z, dim=-1)
    remove = sorted_p.cumsum(-1) - sorted_p >= p  # the mass before this token already reaches p
    return z.masked_fill(remove.scatter(-1, order, remove), -math.inf)
