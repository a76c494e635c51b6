"""Verification of several candidates for one position, and of a batch of draft chains.

`recursive_rejection` is multi-candidate speculative sampling with i.i.d. candidates (SpecInfer's
multi-step rule; MCSD Algorithm 1): candidates are tried in drawn order, each against the current
residual, which after a rejection becomes norm(max(0, residual - draft)); the draft distribution is
never changed. If every candidate fails, the token comes from the last residual. Exact for any k.
"""

from __future__ import annotations

import torch

from .chain import residual, speculative_verify


def recursive_rejection(
    target: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[int | None, torch.Tensor]:
    """target, draft: [V]; candidates: [k] drawn i.i.d. from draft. Returns (index of the accepted
    candidate, its token) or (None, a token from the final residual)."""
    current = target
    u = torch.rand(candidates.shape[0], generator=generator, device=target.device, dtype=target.dtype)
    for i, token in enumerate(candidates.tolist()):
        if u[i] * draft[token] < current[token]:
            return i, candidates[i]
        current = residual(current, draft)
    return None, torch.multinomial(current, 1, generator=generator)[0]


def batch_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    bonus: bool = True,
) -> tuple[int | None, int, torch.Tensor | None]:
    """Batch speculative decoding (seed 002, Algorithm 4) for M chains of g drafts from one prefix.

    target_probs: [M, g + 1, V] (row 0 is the shared distribution after the prefix);
    draft_probs:  [M, g, V] (row 0 likewise shared); tokens: [M, g], chains drawn independently.
    The first tokens go through recursive rejection; the chain whose first token is accepted is then
    verified alone with plain speculative sampling. Returns (chosen chain or None, accepted count,
    next token or None when the whole chain passes without bonus).
    """
    chosen, token = recursive_rejection(target_probs[0, 0], draft_probs[0, 0], tokens[:, 0], generator)
    if chosen is None:
        return None, 0, token
    n, nxt = speculative_verify(target_probs[chosen, 1:], draft_probs[chosen, 1:], tokens[chosen, 1:], generator,
                                bonus=bonus)
    return chosen, 1 + n, nxt
