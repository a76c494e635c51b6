"""`ar`: target-only sampling (greedy at temperature 0), one target forward per token."""

from __future__ import annotations

from ..engine import Session
from ..verify import Verdict


def decode(s: Session) -> None:
    while not s.done:
        s.commit(Verdict.token(target_step(s)))


def target_step(s: Session) -> int:
    """One plain target step: the next token from the target alone."""
    return int(s.sample(s.sampling.probs(s.target.feed(s.tokens)[-1])))
