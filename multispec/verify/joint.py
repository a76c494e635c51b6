"""Joint verification (MTAD Algorithm 1; MJSD): accept the longest draft prefix whose
joint likelihood ratio passes a deterministic threshold, then one token from the target.

For every prefix length j = 1..g the prefix passes when min(1, target(x_1..x_j) / draft(x_1..x_j)) > tau,
tested in log space: log target(x_1..x_j) - log draft(x_1..x_j) > log tau (strict; `strict=False` gives
the authors' code's >=). The accepted length is the *largest* passing j, even where a shorter prefix
failed. The next token comes from the target's row after the accepted prefix: no residual. This rule is
lossy by design: its output follows neither the target's law nor the draft's.

Edge cases: tau = 0 accepts every prefix the target gives positive probability (log 0 = -inf); tau >= 1
accepts nothing (with either comparison, as in the authors' code).
"""

from __future__ import annotations

import math

import torch

from ..warp import categorical
from .verdict import Verdict


def joint_verify(
    target_probs: torch.Tensor,
    draft_logq: torch.Tensor,
    draft_tokens: torch.Tensor,
    tau: float,
    generator: torch.Generator | None = None,
    strict: bool = True,
    next_probs: torch.Tensor | None = None,
) -> Verdict:
    """The joint-likelihood prefix test (MTAD / MJSD): accept the longest prefix x_1..x_n whose ratio
    min(1, target(x_1..x_n) / draft(x_1..x_n)) passes `tau`.

    Args:
        target_probs: [g + 1, V], the target's rows at each draft position and after the last (warped, or raw,
            as the caller chose; the same kind as `draft_logq`).
        draft_logq: [g], log draft(x_1..x_j): the cumulative joint log-probability of the drafted path.
        draft_tokens: [g], the drafted token ids.
        tau: the threshold in [0, 1].
        generator: the random generator of the next token's draw.
        strict: `> tau` (the paper) or `>= tau` (the authors' code).
        next_probs: [g + 1, V] rows to draw the next token from (default target_probs): the warped target when
            the ratio uses raw distributions.

    Returns:
        A `Verdict` accepting the first n drafts, with the next token drawn from row n.
    """
    g = draft_tokens.shape[0]
    n = 0
    if g and tau < 1:
        rows = torch.arange(g, device=draft_tokens.device)
        with torch.no_grad():
            logp = torch.log(target_probs[rows, draft_tokens].double()).cumsum(0)  # -inf after a zero
        margin = logp - draft_logq.double().to(logp.device)
        threshold = math.log(tau) if tau > 0 else -math.inf
        passed = (margin > threshold) if strict else (margin >= threshold)
        passed &= torch.isfinite(logp)  # a prefix the target rules out never passes, whatever tau
        hits = passed.nonzero()
        n = int(hits[-1, 0]) + 1 if hits.numel() else 0
    row = (target_probs if next_probs is None else next_probs)[n]
    nxt = int(categorical(row, generator))
    return Verdict(tuple(range(n)), tuple(draft_tokens[:n].tolist()), nxt, n < g)
