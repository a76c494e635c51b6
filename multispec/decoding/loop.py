"""The loop head every drafting method shares: propose -> score -> verify -> commit, until the session ends.

`speculate` runs it: each iteration the drafter proposes within the room left (`Session.draft_depth`), the
method's `verify(proposal)` scores the proposal with one target forward and applies its rule, the session
commits the verdict to the output and the target's cache, and the drafter hears the verdict (`accept`), which
commits the draft model's cache. Where no draft fits, or the drafter proposes nothing, the iteration is a
plain target step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..drafting import Drafter, Proposal
from ..engine import Session
from ..trees import Shape, cut, shape_depth
from ..verify import Verdict


def target_step(s: Session) -> int:
    """One plain target step: the next token from the target alone."""
    return int(s.sampling.next_token(s.target.feed([s.tokens])[0, -1], s.generator))


def draft_depths(s: Session, wanted: int, bonus: bool = True) -> Iterator[int]:
    """While the session runs: how many draft positions this iteration may hold; where none fits (room for
    one token only) a plain target step is taken instead."""
    while not s.done:
        depth = s.draft_depth(wanted, bonus)
        if depth <= 0:
            s.commit(Verdict.token(target_step(s)))
            continue
        yield depth


def chain_count(proposal: Proposal) -> dict:
    return {"drafted": proposal.size}


def speculate(
    s: Session,
    drafter: Drafter,
    shape: Shape,
    verify: Callable[[Proposal], Verdict],
    bonus: bool = True,
    counted: Callable[[Proposal], dict] = chain_count,
) -> None:
    """Run the loop (module note) with proposals of `shape` (branching factors or a tree; cut to the room left).
    `counted(proposal)`: the counts `Session.commit` records for it (default: every node a draft position)."""
    for depth in draft_depths(s, shape_depth(shape), bonus):
        proposal = drafter.propose(s.tokens, cut(shape, depth))
        if proposal.size == 0:  # nothing proposed (a copying drafter found no match)
            s.commit(Verdict.token(target_step(s)))
        else:
            verdict = verify(proposal)
            s.commit(verdict, **counted(proposal))
            drafter.accept(verdict)
