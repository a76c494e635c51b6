"""`ar`: target-only sampling (greedy at temperature 0), one target forward per token."""

from __future__ import annotations

from ..engine import Session
from ..verify import Verdict
from .loop import target_step
from .registry import Method, register


def decode(s: Session) -> None:
    while not s.done:
        s.commit(Verdict.token(target_step(s)))


register(
    Method(
        "ar",
        decode,
        needs_draft=False,
        exact="reference",
        summary="target-only sampling (greedy at temperature 0)",
        row_entries=lambda params: 1,
    )
)
