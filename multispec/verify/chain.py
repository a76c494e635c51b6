"""Speculative sampling on a chain of drafts (Leviathan et al. 2023; Chen et al. 2023), and the biased
over-accepting variant of Yin et al. (2024) (Decoding-OPT / Decoding-UNO).

Exact rule: accept draft token x at position i with probability min(1, target_i(x) / draft_i(x)); at
the first rejection draw the replacement from norm(max(0, target_i - draft_i)); if every draft passes,
draw a bonus token from the target's distribution after the last draft. The output is distributed
exactly as sampling from the target alone.
"""

from __future__ import annotations

import torch

from ..warp import categorical
from .verdict import Verdict

# Below this residual mass a rejection can only come from rounding; fall back to the target row.
RESIDUAL_EPS = 1e-12


def residual(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """norm(max(0, target - draft)) along the last axis; the target itself where the mass vanishes."""
    r = (target - draft).clamp_min_(0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > RESIDUAL_EPS, r / mass.clamp_min(RESIDUAL_EPS), target)


def _residual_weights(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """`residual` left unnormalised, for a draw (which normalises): two passes over the row fewer."""
    r = (target - draft).clamp_min_(0)
    return r if float(r.sum()) > RESIDUAL_EPS else target


def _accepted_prefix(on_target: torch.Tensor, on_draft: torch.Tensor, generator) -> int:
    """Length of the accepted prefix when position i passes iff u_i < on_target_i / on_draft_i."""
    g = on_target.shape[0]
    if g == 0:
        return 0
    u = torch.rand(g, generator=generator, device=on_target.device, dtype=on_target.dtype)
    # written without the division; drafted tokens have on_draft > 0
    return int((u * on_draft < on_target).cumprod(0).sum())


def speculative_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    bonus: bool = True,
) -> Verdict:
    """Verify a chain of drafts.

    target_probs: [g + 1, V] (or [g, V] without bonus), the target's warped distributions at each draft
                  position and after the last.
    draft_probs:  [g, V], the draft's warped distributions the drafts were sampled from.
    draft_tokens: [g], the drafted token ids.
    Returns a `Verdict` accepting nodes 0..n-1 (the first n drafts); its next token is None only when all
    drafts pass and `bonus` is off.
    """
    rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
    n = _accepted_prefix(target_probs[rows, draft_tokens], draft_probs[rows, draft_tokens], generator)
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
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
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
    rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
    on_target = target_probs[rows, draft_tokens] + eps
    n = _accepted_prefix(on_target, draft_probs[rows, draft_tokens], generator)
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
