"""`sd`: speculative sampling with a chain of `gamma` drafts (Leviathan et al. 2023; Chen et al. 2023).

propose: `DraftChain` samples up to gamma tokens one by one from the draft's warped distributions,
         stopping early after a token it gave less than `confidence` (dynamic draft length);
score:   one target forward over the uncached committed token(s) and the drafts;
verify:  `multispec.verify.speculative_verify` (exact residual, bonus token);
commit:  `Session.commit`: both caches keep the accepted drafts; the new endpoint token is left uncached.
"""

from __future__ import annotations

from functools import partial

from ..engine import Session
from ..proposers import DraftChain
from ..verify import relaxed_verify, speculative_verify


def decode(s: Session, gamma: int = 4, bonus: bool = True, confidence: float = 0.0, verify=speculative_verify) -> None:
    """`bonus=False` drops the free token after a fully accepted chain (seed 002's analysis setting).
    `confidence` > 0 ends a chain early after a draft token whose unwarped draft probability is below it."""
    proposer = DraftChain(confidence)
    while not s.done:
        g = s.draft_depth(gamma, bonus)
        proposal = proposer.propose(s, (1,) * g)
        drafts = proposal.tokens
        # without a bonus token nothing needs the target's distribution after the last draft
        scored = drafts if bonus else drafts[:-1]
        target_probs = s.sampling.probs(s.target.feed(s.tokens, scored))
        verdict = verify(target_probs, proposal.draft_probs, drafts, s.generator, bonus=bonus)
        s.commit(verdict, drafted=drafts.shape[0])
        proposer.observe(verdict)


def decode_relaxed(s: Session, gamma: int = 4, eps: float = 0.1, resample: str = "opt", bonus: bool = True) -> None:
    """`sd-opt`: the same loop with seed 002's over-accepting rule; eps = 0 with "opt" is `sd`."""
    decode(s, gamma, bonus, verify=partial(relaxed_verify, eps=eps, resample=resample))
