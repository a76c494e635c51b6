"""Speculative sampling on a chain of drafts (Leviathan et al. 2023; Chen et al. 2023).

Accept draft token x at position i with probability min(1, target_i(x) / draft_i(x)); at the first
rejection draw the replacement from norm(max(0, target_i - draft_i)); if every draft passes, draw a
bonus token from the target's distribution after the last draft. The output is distributed exactly as
sampling from the target alone.
"""

from __future__ import annotations

import torch

# Below this residual mass a rejection can only come from rounding; fall back to the target row.
RESIDUAL_EPS = 1e-12


def residual(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """norm(max(0, target - draft)) along the last axis; the target itself where the mass vanishes."""
    r = (target - draft).clamp_min_(0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > RESIDUAL_EPS, r / mass.clamp_min(RESIDUAL_EPS), target)


def speculative_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, torch.Tensor]:
    """Verify a chain of drafts.

    target_probs: [g + 1, V], the target's warped distributions at each draft position and after the last.
    draft_probs:  [g, V], the draft's warped distributions the drafts were sampled from.
    draft_tokens: [g], the drafted token ids.
    Returns (number accepted n, next token): the caller commits draft_tokens[:n] then the next token.
    """
    g = draft_tokens.shape[0]
    rows = torch.arange(g, device=draft_tokens.device)
    on_target = target_probs[rows, draft_tokens]
    on_draft = draft_probs[rows, draft_tokens]
    u = torch.rand(g, generator=generator, device=target_probs.device, dtype=target_probs.dtype)
    # accept iff u < target/draft, written without the division; drafted tokens have draft > 0
    accepted = u * on_draft < on_target
    n = int(accepted.cumprod(0).sum()) if g else 0
    dist = residual(target_probs[n], draft_probs[n]) if n < g else target_probs[g]
    return n, torch.multinomial(dist, 1, generator=generator)[0]
