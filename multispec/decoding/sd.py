"""`sd`: speculative sampling with a chain of `gamma` drafts (Leviathan et al. 2023; Chen et al. 2023).

propose: the draft samples up to gamma tokens one by one from its warped distributions (kept for verify),
         stopping early after a token it gave less than `confidence` (dynamic draft length);
score:   one target forward over the uncached committed token(s) and the gamma drafts;
verify:  `multispec.verify.speculative_verify` (exact residual, bonus token);
commit:  both caches keep the accepted drafts; the new endpoint token is left uncached.

The early stop stays exact: whether a chain goes on is decided by the draft alone from the tokens
already drawn, so given the committed prefix each position is either a verified draft or a target draw.
"""

from __future__ import annotations

from functools import partial

import torch

from ..engine import Session
from ..verify import relaxed_verify, speculative_verify


def decode(s: Session, gamma: int = 4, bonus: bool = True, confidence: float = 0.0, verify=speculative_verify) -> None:
    """`bonus=False` drops the free token after a fully accepted chain (seed 002's analysis setting).
    `confidence` > 0 ends a chain early after a draft token whose unwarped draft probability is below it."""
    while not s.done:
        # the bonus token needs a slot too; without bonus, draft up to the budget
        g = min(gamma, s.budget() - 1) if bonus else max(1, min(gamma, s.budget()))
        drafts, draft_probs = _propose(s, g, confidence)
        g = drafts.shape[0]
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


def _propose(s: Session, g: int, confidence: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to g draft tokens [n] and the warped draft distributions they were drawn from [n, V]; with
    `confidence`, the chain ends after the first token whose probability under the draft's plain softmax
    (not the warped one, which is one-hot when greedy) is below it."""
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
        if confidence > 0 and torch.softmax(logits[-1].float(), -1)[token] < confidence:
            break
        if i + 1 < g:  # the last draft is never fed to the draft model
            logits = s.draft.feed(s.tokens, token.reshape(1))
    return torch.stack(tokens).to(device), torch.stack(probs).to(device)
