"""`bild`: the Big Little Decoder baseline (Kim et al. 2023) as the seed 000 / 001 authors ran it.

propose: the draft samples up to `max_unchecked` tokens, one at a time, and stops early after a token drawn
         from a distribution whose largest probability is below `fallback` (the draft is unsure);
score:   one target forward over the uncached committed token and the unchecked tokens;
verify:  `rollback_verify`: keep the tokens up to the first whose -log target probability exceeds
         `rollback`, then one token from the warped target after the kept prefix;
commit:  `Session.commit`.

Lossy by design. The original BiLD lets the target produce the token at the unsure position instead; the
authors' version, kept here, checks every unchecked token and samples the fallback token.
"""

from __future__ import annotations

from ..engine import Session
from ..proposers import DraftChain
from ..verify import rollback_verify
from .ar import draft_depths


def decode(s: Session, fallback: float = 0.9, rollback: float = 1.0, max_unchecked: int = 10) -> None:
    proposer = DraftChain(fallback=fallback)
    for g in draft_depths(s, max_unchecked):
        proposal = proposer.propose(s, (1,) * g)
        target_probs = s.sampling.probs(s.target.feed(s.tokens, proposal.tokens))
        verdict = rollback_verify(target_probs, proposal.tokens, rollback, s.generator)
        s.commit(verdict, drafted=proposal.tokens.shape[0])
