"""`sd`: speculative sampling with a chain of `gamma` drafts (Leviathan et al. 2023; Chen et al. 2023).

propose: the draft samples gamma tokens one by one from its warped distributions (kept for verify);
score:   one target forward over the uncached committed token(s) and the gamma drafts;
verify:  `multispec.verify.speculative_verify` (exact residual, bonus token);
commit:  both caches keep the accepted drafts; the new endpoint token is left uncached.
"""

from __future__ import annotations

from functools import partial

import torch

from ..engine import Session
from ..verify import relaxed_verify, speculative_verify


def decode(s: Session, gamma: int = 4, bonus: bool = True, verify=speculative_verify) -> None:
    """`bonus=False` drops the free token after a fully accepted chain (seed 002's analysis setting)."""
    while not s.done:
        # the bonus token needs a slot too; without bonus, draft up to the budget
        g = min(gamma, s.budget() - 1) if bonus else max(1, min(gamma, s.budget()))
        drafts, draft_probs = _propose(s, g)
        # without a bonus token nothing needs the target's distribution after the last draft
        scored = drafts if bonus else drafts[:-1]
        target_probs = s.sampling.probs(s.target.feed(s.tokens, scored))
        n, token = verify(target_probs, draft_probs, drafts, s.generator, bonus=bonus)
        new = drafts[:n].tolist() + ([] if token is None else [int(token)])
        s.commit(new, drafted=g, accepted=n, rejected=n < g)
        s.target.commit(len(s.tokens), list(range(n)))
        s.draft.commit(len(s.tokens), list(range(n)))


def decode_relaxed(s: Session, gamma: int = 4, eps: float = 0.1, resample: str = "opt", bonus: bool = True) -> None:
    """`sd-opt`: the same loop with seed 002's over-accepting rule; eps = 0 with "opt" is `sd`."""
    decode(s, gamma, bonus, verify=partial(relaxed_verify, eps=eps, resample=resample))


def _propose(s: Session, g: int) -> tuple[torch.Tensor, torch.Tensor]:
    """g draft tokens [g] and the warped draft distributions they were drawn from [g, V]."""
    device = s.target_model.device
    if g <= 0:
        return torch.empty(0, dtype=torch.long, device=device), torch.empty(0, s.target_model.vocab_size)
    probs, tokens = [], []
    logits = s.draft.feed(s.tokens)
    for i in range(g):
        q = s.sampling.probs(logits[-1])
        token = s.sample(q)
        probs.append(q)
        tokens.append(token)
        if i + 1 < g:  # the last draft is never fed to the draft model
            logits = s.draft.feed(s.tokens, token.reshape(1))
    return torch.stack(tokens).to(device), torch.stack(probs).to(device)
