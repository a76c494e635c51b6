"""`ar`: target-only sampling (greedy at temperature 0), one target forward per token."""

from __future__ import annotations

from ..engine import Session


def decode(s: Session) -> None:
    while not s.done:
        logits = s.target.feed(s.tokens)
        token = s.sample(s.sampling.probs(logits[-1]))
        s.commit([int(token)])
