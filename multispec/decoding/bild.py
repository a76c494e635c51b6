"""`bild`: the Big Little Decoder baseline (Kim et al., 2023) as the MTAD and MJSD authors ran it.

propose: the draft samples up to `max_unchecked` tokens, one at a time, and stops early after a token drawn
         from a distribution whose largest probability is below `fallback` (the draft is unsure);
score:   one target forward over the uncached committed token and the unchecked tokens;
verify:  `rollback_verify`: keep the tokens up to the first whose -log target probability exceeds
         `rollback`, then one token from the warped target after the kept prefix;
commit:  the session commits the target; the drafter keeps its accepted tokens.

Lossy by design. The original BiLD lets the target produce the token at the unsure position instead; the
authors' version, kept here, checks every unchecked token and samples the fallback token.
"""

from __future__ import annotations

from ..drafting import DraftChain, setup_of
from ..engine import Entries, Session
from ..verify import rollback_verify
from .loop import speculate
from .registry import DRAFT_VOCAB, MAX_DEPTH, Method, Param, register, size


def decode(s: Session, *, fallback: float, rollback: float, max_unchecked: int) -> None:
    drafter = DraftChain(s.draft_runner(), setup_of(s), fallback=fallback)

    def verify(proposal):
        target_probs = s.sampling.probs(s.target.feed([s.tokens], Entries.chain(proposal.tokens))[0])
        return rollback_verify(target_probs, proposal.tokens, rollback, s.generator)

    speculate(s, drafter, (1,) * max_unchecked, verify)


register(
    Method(
        "bild",
        decode,
        needs_draft=True,
        exact="lossy by design: the target keeps draft tokens it finds likely enough",
        summary="Big Little Decoder baseline: the target checks the draft when it is unsure (as run by the "
        "MTAD and MJSD authors)",
        row_entries=lambda params: int(params["max_unchecked"]) + 1,
        params={
            "fallback": Param(
                float,
                0.9,
                lambda v: 0 <= v <= 1,
                "a number in [0, 1]",
                "hand over to the target after a draft token drawn from a distribution "
                "whose largest probability is below this",
            ),
            "rollback": Param(
                float,
                1.0,
                lambda v: 0 <= v <= 1e6,
                "a number in [0, 1e6]",
                "roll back at the first draft token whose -log target probability exceeds this",
            ),
            "max_unchecked": size(10, MAX_DEPTH, "draft tokens before the target checks them anyway"),
            "draft_vocab": DRAFT_VOCAB,
        },
    )
)
