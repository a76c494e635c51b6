"""`tree=auto`: the tree, chain or nothing that promises the most tokens per second, chosen each iteration from
the acceptance by sibling rank measured so far in the call (`multispec.tree_search`), the machine's forward
costs and the measured per-iteration work.

The choice depends only on past verdicts, never on this iteration's, so the method's law is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..models.cost import ForwardCost
from ..tree_search import RankAcceptance, TreeChoice, TreeTable, fastest_tree, reach_of
from ..trees import Shape, TokenTree, shape_depth
from ..verify.verdict import Verdict
from .base import Drafter, Proposal
from .model import DraftTree

AUTO_MAX_NODES, AUTO_MAX_DEPTH = 64, 12
EXPLORE = 3  # one-node tries before the record may choose no drafting at all
PRIOR_WEIGHT = 20.0  # pseudo-tries behind a prior acceptance vector (from `multispec tune`)
OVERHEAD_PRIOR = 1e-3  # seconds of per-iteration work assumed before any is measured


def replans(call: int) -> bool:
    """Whether to search again at this call: often while the record is thin, then every 16 calls (a search
    costs ~10-20 ms)."""
    return call in (1, 2, 4, 8) or call % 16 == 0


class AutoTree(Drafter):
    """Wraps a `DraftTree`: each iteration proposes the current best tree (see module note), cut to the room.
    `ranks()` gives the call's acceptance record for this drafter (the session's), `forward_seconds()` the
    forward time so far (both models), `pending(context)` the tokens the target has not cached."""

    name = "auto-tree"

    def __init__(self, drafter: DraftTree, ranks: Callable[[], RankAcceptance], target_cost: ForwardCost,
                 draft_cost: ForwardCost | None, forward_seconds: Callable[[], float],
                 pending: Callable[[list[int]], int], prior: list[float] | None = None,
                 max_nodes: int = AUTO_MAX_NODES, max_depth: int = AUTO_MAX_DEPTH):
        self.drafter, self.ranks, self.pending = drafter, ranks, pending
        self.target_cost, self.draft_cost, self.forward_seconds = target_cost, draft_cost, forward_seconds
        self.prior, self.max_nodes, self.max_depth = prior, max_nodes, max_depth
        self.choice: TreeChoice | None = None
        self.tree = TokenTree.chain(0)
        self.overhead = OVERHEAD_PRIOR
        self.calls = 0
        self.used: dict[str, int] = {}
        self.predicted_tokens = self.predicted_seconds = 0.0
        self._last: tuple[float, float] | None = None  # (clock, forward seconds) at the last proposal
        self._start: tuple[float, int] | None = None

    def search(self, context: int, pending: int) -> None:
        counts = self.ranks()
        rates = counts.rates(self.max_depth, self.prior, weight=PRIOR_WEIGHT if self.prior else None)
        table = TreeTable(reach_of(rates), self.max_nodes, self.max_depth)
        self.choice = fastest_tree(table, self.target_cost, self.draft_cost, context, self.overhead, pending=pending)
        if self.choice.nodes == 0 and (counts.tries[0, 0] if counts.tries.size else 0) < EXPLORE:
            self.choice = TreeChoice(1, 1, table.value(1, 1), self.choice.seconds, (1,))
        self.tree = table.tree(self.choice.nodes, self.choice.depth)

    def propose(self, context: list[int], shape: Shape) -> Proposal:
        self.calls += 1
        now, forward = time.perf_counter(), self.forward_seconds()
        if self._last is not None:  # the work between two proposals that was not a forward
            self.overhead = 0.8 * self.overhead + 0.2 * max(0.0, (now - self._last[0]) - (forward - self._last[1]))
        if self.calls == 2:
            self._start = (now, len(context))
        pending = self.pending(context)
        searched = 0.0
        if replans(self.calls):
            self.search(len(context), pending)
            searched = time.perf_counter() - now
        tree = self.tree.truncate(shape_depth(shape))
        label = tree.describe() if tree.size else "none"
        self.used[label] = self.used.get(label, 0) + 1
        if self.calls >= 2 and self.choice is not None:
            self.predicted_tokens += self.choice.tokens
            self.predicted_seconds += self.choice.seconds
        # the next proposal measures the work since this point, drafting's Python included, search excluded
        self._last = (now + searched, forward)
        return self.drafter.propose(context, tree) if tree.size else self.drafter.setup.empty()

    def accept(self, verdict: Verdict) -> None:
        self.drafter.accept(verdict)

    def report(self, tokens: int) -> dict:
        seconds = time.perf_counter() - self._start[0] if self._start else 0.0
        decoded = tokens - self._start[1] if self._start else 0
        top = sorted(self.used.items(), key=lambda kv: -kv[1])[:5]
        return {
            "trees_used": dict(top),
            "predicted_tokens_per_second": (self.predicted_tokens / self.predicted_seconds
                                            if self.predicted_seconds else None),
            "decode_tokens_per_second": decoded / seconds if decoded and seconds > 0 else None,
            "iteration_overhead_seconds": self.overhead,
        }
