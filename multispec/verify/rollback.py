"""BiLD's rollback rule (Kim et al. 2023, as the MTAD / 001 authors implemented it): the target keeps
the unchecked draft tokens up to the first one it finds too unlikely, then draws one token itself.

A draft token is rolled back when its negative log-likelihood under the target, -log target(x_j | prefix),
exceeds `tau2`; the walk stops at the first such token. The next token is drawn from the target's row
right after the kept prefix (no residual). Lossy by design: the output follows neither model's law.
"""

from __future__ import annotations

import math

import torch

from ..warp import categorical
from .verdict import Verdict


def rollback_verify(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    tau2: float,
    generator: torch.Generator | None = None,
) -> Verdict:
    """target_probs: [g + 1, V], the target's (warped) rows at each draft position and after the last;
    draft_tokens:  [g];
    tau2:          the rollback threshold on -log target(x_j | prefix), >= 0 (a token the target rules
                   out, probability 0, is always rolled back).
    """
    g = draft_tokens.shape[0]
    rows = torch.arange(g, device=draft_tokens.device)
    picked = target_probs[rows, draft_tokens].double()
    # -log p > tau2  <=>  p < exp(-tau2); p = 0 fails for every finite tau2
    failed = (picked < math.exp(-tau2)) | (picked <= 0)
    hits = failed.nonzero()
    n = int(hits[0, 0]) if hits.numel() else g
    nxt = int(categorical(target_probs[n], generator))
    return Verdict(tuple(range(n)), tuple(draft_tokens[:n].tolist()), nxt, n < g)
