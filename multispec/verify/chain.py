"""Speculative sampling on a chain of drafts (Leviathan et al. 2023; Chen et al. 2023), and the biased
over-accepting variant of Yin et al. (2024) (Decoding-OPT / Decoding-UNO).

Exact rule: accept draft token x at position i with probability min(1, target_i(x) / draft_i(x)); at
the first rejection draw the replacement from norm(max(0, target_i - draft_i)); if every draft passes,
draw a bonus token from the target's distribution after the last draft. The output is distributed
exactly as sampling from the target alone.
"""

from __future__ import annotations

import numpy as np
import torch

from ..warp import LazyRows, categorical
from .verdict import Verdict

# Below this residual mass a rejection can only come from rounding; fall back to the target row.
RESIDUAL_EPS = 1e-12

Rows = torch.Tensor | LazyRows  # [n, V] probability rows, read row by row


def residual(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """norm(max(0, target - draft)) along the last axis; the target itself where the mass vanishes."""
    r = (target - draft).clamp_min_(0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > RESIDUAL_EPS, r / mass.clamp_min(RESIDUAL_EPS), target)


def _residual_weights(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """`residual` left unnormalised, for a draw (which normalises): two passes over the row fewer."""
    r = (target - draft).clamp_min_(0)
    return r if float(r.sum()) > RESIDUAL_EPS else target


def _accepted_prefix(
    target_probs: Rows, draft_probs: Rows, draft_tokens: torch.Tensor, generator, eps: float = 0.0
) -> int:
    """Length of the accepted prefix when position i passes iff u_i * draft_i(x_i) < target_i(x_i) + eps (the
    ratio test written without the division; drafted tokens have draft_i(x_i) > 0), with the uniforms drawn
    together. Tensors are tested at once (one device sync); `LazyRows` are read in order up to the first
    rejection only, the test computed in the rows' precision as the tensor arithmetic does, so both give the
    same verdict from the same uniforms."""
    g = draft_tokens.shape[0]
    if g == 0:
        return 0
    first_target, first_draft = target_probs[0], draft_probs[0]
    u = torch.rand(g, generator=generator, device=first_target.device, dtype=first_target.dtype)
    if isinstance(target_probs, torch.Tensor) and isinstance(draft_probs, torch.Tensor):
        rows = torch.arange(g, device=draft_tokens.device)
        return int((u * draft_probs[rows, draft_tokens] < target_probs[rows, draft_tokens] + eps).cumprod(0).sum())
    real = np.float64 if torch.promote_types(first_target.dtype, first_draft.dtype) == torch.float64 else np.float32
    for i, (token, ui) in enumerate(zip(draft_tokens.tolist(), u.tolist(), strict=True)):
        on_target = real(float(target_probs[i][token])) + real(eps)
        if not real(ui) * real(float(draft_probs[i][token])) < on_target:
            return i
    return g


def speculative_verify(
    target_probs: Rows,
    draft_probs: Rows,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    bonus: bool = True,
) -> Verdict:
    """Verify a chain of drafts: accept draft i with min(1, target / draft), draw from the residual
    norm(max(0, target - draft)) at the first rejection, or the bonus token from the last row.

    Args:
        target_probs: [g + 1, V] (or [g, V] without bonus), the target's warped distributions at each draft
            position and after the last: a tensor, or `LazyRows` (rows after the first rejection are never read).
        draft_probs: [g, V], the draft's warped distributions the drafts were sampled from (a tensor or
            `LazyRows`).
        draft_tokens: [g], the drafted token ids.
        generator: the random generator of the draws.
        bonus: draw a target token after a fully accepted chain.

    Returns:
        A `Verdict` accepting nodes 0..n-1 (the first n drafts); its next token is None only when all drafts pass
        and `bonus` is off.
    """
    n = _accepted_prefix(target_probs, draft_probs, draft_tokens, generator)
    if n < draft_tokens.shape[0]:
        dist = _residual_weights(target_probs[n], draft_probs[n])
    elif bonus:
        dist = target_probs[n]
    else:
        dist = None
    return _chain_verdict(draft_tokens, n, dist, generator)


def greedy_verify(target_tokens: torch.Tensor, draft_tokens: torch.Tensor, bonus: bool = True) -> Verdict:
    """`speculative_verify` where every target row is one-hot (temperature 0), from the target's argmax tokens
    alone: a draft passes iff it is the target's token (min(1, 1 / d(x)) or 0, whatever the draft row), and
    the token after the accepted drafts is the target's (the residual of a one-hot row that rejected x is
    that row). No probability rows, no random numbers.

    target_tokens: [g + 1] (or [g] without bonus), the target's argmax at each draft position and after the last.
    draft_tokens:  [g].
    """
    g = draft_tokens.shape[0]
    target, drafts = target_tokens.tolist(), draft_tokens.tolist()
    n = next((i for i in range(g) if drafts[i] != target[i]), g)
    nxt = target[n] if n < g or bonus else None
    return Verdict(tuple(range(n)), tuple(drafts[:n]), nxt, n < g)


def _chain_verdict(draft_tokens: torch.Tensor, n: int, dist: torch.Tensor | None, generator) -> Verdict:
    nxt = None if dist is None else int(categorical(dist, generator))
    return Verdict(tuple(range(n)), tuple(draft_tokens[:n].tolist()), nxt, n < draft_tokens.shape[0])


def relaxed_verify(
    target_probs: Rows,
    draft_probs: Rows,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    bonus: bool = True,
    eps: float = 0.0,
    resample: str = "opt",
) -> Verdict:
    """Over-accepting verification (Yin et al., 2024, §3.4): accept with b(x) = min(1, (target(x) + eps) / draft(x)).

    On rejection resample from "opt": P* = norm([target - b * draft]_+), the bias-minimising distribution
    (Theorem 4; for this b it equals the exact residual), or "uno": the target distribution itself.
    eps = 0 with "opt" is exactly `speculative_verify`, draw for draw.
    """
    n = _accepted_prefix(target_probs, draft_probs, draft_tokens, generator, eps)
    if n < draft_tokens.shape[0]:
        if resample == "opt":
            b = ((target_probs[n] + eps) / draft_probs[n]).nan_to_num(1.0).clamp_max(1.0)
            dist = _residual_weights(target_probs[n], b * draft_probs[n])
        else:
            dist = target_probs[n]
    elif bonus:
        dist = target_probs[n]
    else:
        dist = None
    return _chain_verdict(draft_tokens, n, dist, generator)
