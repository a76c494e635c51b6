"""`sd`: speculative sampling with a chain of `gamma` drafts (Leviathan et al. 2023; Chen et al. 2023).

propose: the draft samples gamma tokens one by one from its warped distributions (kept for verify);
score:   one target forward over the uncached committed token(s) and the gamma drafts;
verify:  `multispec.verify.speculative_verify` (exact residual, bonus token);
commit:  both caches keep the accepted drafts; the new endpoint token is left uncached.
"""

from __future__ import annotations

import torch

from ..engine import Session
from ..verify import speculative_verify


def decode(s: Session, gamma: int = 4, verify=speculative_verify) -> None:
    while not s.done:
        g = min(gamma, s.budget() - 1)  # the bonus token needs a slot too
        drafts, draft_probs = _propose(s, g)
        target_probs = s.sampling.probs(s.target.feed(s.tokens, drafts))
        n, token = verify(target_probs, draft_probs, drafts, s.generator)
        new = drafts[:n].tolist() + [int(token)]
        s.commit(new, drafted=g, accepted=n)
        s.target.commit(len(s.tokens), list(range(n)))
        s.draft.commit(len(s.tokens), list(range(n)))


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
