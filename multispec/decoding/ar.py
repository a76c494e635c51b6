"""`ar`: target-only sampling (greedy at temperature 0), one target forward per token."""

from __future__ import annotations

from collections.abc import Iterator

from ..engine import Session
from ..verify import Verdict


def decode(s: Session) -> None:
    while not s.done:
        s.commit(Verdict.token(target_step(s)))


def target_step(s: Session) -> int:
    """One plain target step: the next token from the target alone."""
    return int(s.sample(s.sampling.probs(s.target.feed(s.tokens)[-1])))


def draft_depths(s: Session, wanted: int, bonus: bool = True) -> Iterator[int]:
    """The iterations of a drafting loop: while the session runs, how many draft positions this one may
    hold (`Session.draft_depth`); where no draft fits (room for one token only) a plain target step is
    taken instead."""
    while not s.done:
        depth = s.draft_depth(wanted, bonus)
        if depth <= 0:
            s.commit(Verdict.token(target_step(s)))
            continue
        yield depth
