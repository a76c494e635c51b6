"""`tree=auto`: the tree, chain or nothing that promises the most tokens per second, chosen each iteration from
the acceptance by sibling rank measured so far in the call (`multispec.tree_search`), the machine's forward
costs and the work besides forwards, each priced by the kind of iteration it would be: a plain target step, a
chain (which the engine scores causally) or a tree (through an explicit mask, which has its own curve).

In a batch (`multispec.batching`), a row prices every choice as the batch's iteration (`RowLoad`, as
`gamma=auto` does): one packed forward over the other rows' tokens and its own, the draft's forwards over every
row, and the tokens the whole batch commits, so that as rows join a tree must pay for itself against a fuller
forward, and trees shrink, down to none.

The choice depends only on past verdicts, never on this iteration's, so the method's law is unchanged. Its
inputs are the seed's verdicts and the curves cached per machine, so the same seed gives the same tokens;
with `adapt` it also follows this call's measured times, which no seed fixes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..models.cost import ForwardCost
from ..tree_search import RankAcceptance, TreeChoice, iteration_seconds, search_tree
from ..trees import Shape, TokenTree, shape_depth
from ..verify.verdict import Verdict
from .base import Drafter, Proposal
from .model import DraftTree

AUTO_MAX_NODES, AUTO_MAX_DEPTH = 64, 12
EXPLORE = 3  # one-node tries before a record without a prior may choose no drafting at all
PRIOR_WEIGHT = 20.0  # pseudo-tries behind a prior acceptance vector (from `multispec tune`)
# seconds of work besides forwards assumed before any is measured: a drafting iteration's, a plain step's
OVERHEAD_PRIOR, PLAIN_OVERHEAD_PRIOR = 1e-3, 5e-4
# while it runs plain steps no verdicts come in, so a run of early rejections would keep it from drafting for the
# rest of the call: every PROBE_EVERY calls a plain-step choice gives way to one one-node chain (about a plain
# step's price where drafting does not pay) and the next call searches on what it saw. Only where the draft has
# read the context but for the last calls' tokens: a probe that first made the draft read a long prompt cost up to
# a tenth of the speed (measured with benchmarks/optimal_trees.py)
PROBE_EVERY = 16
# drafting is chosen only where priced this much faster than a plain step: its prices come from a few runs (a
# fixed tree priced 1 % ahead of plain steps measured 11 % behind them on translation), a plain step's from ar's
DRAFT_MARGIN = 0.05
# a scheduled search with no new verdicts since the last one (as when no drafting was chosen) can change its
# answer only through the context length: it is repeated once the context has grown by this factor
CONTEXT_GROWTH = 1.25


def replans(call: int) -> bool:
    """Whether to search again at this call: often while the record is thin, then every 16 calls (a search
    costs ~10-20 ms)."""
    return call in (1, 2, 4, 8) or call % 16 == 0


@dataclass(frozen=True)
class Factors:
    """Measured over calibrated forward seconds, by kind of iteration: the target's forward in a plain step, a
    chain's and a tree's iteration, and the draft's forwards in a chain's and a tree's (`multispec tune`
    measures them; a process's speed and a kind's own work move them away from 1)."""

    plain: float = 1.0
    chain: float = 1.0
    tree: float = 1.0
    chain_draft: float = 1.0
    tree_draft: float = 1.0


def iteration_kind(tree: TokenTree) -> str:
    return "plain" if not tree.size else "chain" if tree.is_chain else "tree"


class AutoTree(Drafter):
    """Wraps a `DraftTree`: each iteration proposes the current best tree (see module note), searched again
    when the room left is shallower than it.
    `ranks()` gives the call's acceptance record for this drafter (the session's), `pending(context)` the
    tokens the target has not cached; `chain`, a `DraftChain` on the same draft runner, proposes the chains it
    picks; `target_cost` is the causal forward's curve (plain steps and chains),
    `tree_cost` a tree's (default the causal); `overhead` the work besides forwards in seconds: a tree
    iteration's (per iteration, per node), a plain step's, and a chain's (per iteration, per node; default the
    tree's); `factors` scale the curves by kind (`Factors`).
    With `adapt`, `forward_seconds()` (the forward time so far: target, draft) and the clock replace the
    overheads by their measured averages and the factors by measured over predicted forward time, per kind."""

    name = "auto-tree"

    def __init__(
        self,
        drafter: DraftTree,
        ranks: Callable[[], RankAcceptance],
        target_cost: ForwardCost,
        draft_cost: ForwardCost | None,
        forward_seconds: Callable[[], tuple[float, float]],
        pending: Callable[[list[int]], int],
        prior: list[float] | list[list[float]] | None = None,
        max_nodes: int = AUTO_MAX_NODES,
        max_depth: int = AUTO_MAX_DEPTH,
        tree_cost: ForwardCost | None = None,
        overhead: tuple[float, ...] = (OVERHEAD_PRIOR, 0.0, PLAIN_OVERHEAD_PRIOR),
        factors: Factors | None = None,
        adapt: bool = False,
        one_time: Callable[[], float] = lambda: 0.0,
        chain: Drafter | None = None,
        draft_behind: Callable[[list[int]], int] | None = None,
        budget: Callable[[], int] | None = None,
        load: Any = None,
    ):
        self.drafter, self.ranks, self.pending = drafter, ranks, pending
        # the chains it picks go through a chain proposer where given (on the same draft runner): the same
        # draws' law with a fifth of the tree proposer's work; `accept` goes to whichever proposed
        self.chain = chain
        # how many tokens the draft has not read, and how many the call may still commit: a draft far behind (after
        # the prompt, or plain steps) first reads them all, once, which the tokens left share
        self.draft_behind, self.budget = draft_behind, budget
        # a sequence decoded in a batch (`multispec.batching.RowLoad`): searched on the batch's prices (module note)
        self.load = load
        self._proposer: Drafter = drafter
        self.one_time = one_time  # one-time seconds so far (compiles mid-call are not decoding)
        self.target_cost, self.draft_cost, self.forward_seconds = target_cost, draft_cost, forward_seconds
        self.tree_cost = tree_cost or target_cost
        self.prior, self.max_nodes, self.max_depth = prior, max_nodes, max_depth
        self.adapt = adapt
        self.choice: TreeChoice | None = None
        self._use(TokenTree.chain(0))
        self.overhead, self.per_node, self.plain_overhead = overhead[:3]
        # a chain's work: its own line where measured (it skips the tree's masks and bookkeeping)
        self.chain_overhead, self.chain_per_node = overhead[3:5] if len(overhead) >= 5 else overhead[:2]
        self.calls = 0
        self.used: dict[str, int] = {}
        self.predicted_tokens = self.predicted_seconds = 0.0
        f = factors or Factors()
        # per kind, measured over calibrated forward seconds: [target, draft] (followed with adapt)
        self.factors = {"plain": [f.plain, 1.0], "chain": [f.chain, f.chain_draft], "tree": [f.tree, f.tree_draft]}
        # at the last proposal: (clock, target seconds, draft seconds, predicted target, predicted draft, kind)
        self._last: tuple[float, float, float, float, float, str] | None = None
        self._start: tuple[float, int, float] | None = None  # (time, tokens, one-time seconds) at the second call
        # (tries recorded, context length, rows in the batch) at the last search
        self._searched: tuple[float, int, int] | None = None
        self.searches = 0
        self.probes = 0
        self._probed = False  # the last call proposed a probe: search on its verdict
        self.search_seconds = 0.0

    def search(self, context: int, pending: int, room: int, behind: int = 1) -> None:
        """Find the fastest tree of depth at most `room` (the tokens left bound it); the draft is `behind` tokens
        behind the context."""
        counts = self.ranks()
        self._searched = (float(counts.tries.sum()), context, self._rows())
        self.searches += 1
        depth = max(1, min(self.max_depth, room))
        rates = counts.rates(depth, self.prior, weight=PRIOR_WEIGHT if self.prior else None)
        tree_cost, draft_cost, chain_cost, chain_draft = self._priced("tree") + self._priced("chain")
        plain_cost, batch = self.target_cost.scaled(self.factors["plain"][0]), {}
        load = None if self.load is None or self.load.alone else self.load  # a lone row prices as one sequence
        if load is not None:
            # one packed forward whatever the kind (a tree's mask is per row there), and one draft forward over
            # every row per level: the batch's curves, with what the other rows feed, draft and commit
            target = load.target_curve(pending + self.max_nodes)
            tree_cost = chain_cost = plain_cost = ForwardCost(tuple(target[1:]))
            draft_cost = chain_draft = ForwardCost(tuple(load.draft_curve(self.max_nodes)[1:]))
            batch = {"others_tokens": load.others(0)[0], "others_drafting": load.others_drafting()}
        left = self.budget() if self.budget is not None else 0
        # the catch-up token is in every drafting iteration's price; the rest of a long catch-up is paid once
        switch = (
            (chain_draft(behind, context) - chain_draft(1, context)) / left
            if (behind > 1 and left > 0 and chain_draft is not None)
            else 0.0
        )
        self.choice, table = search_tree(
            rates,
            self.max_nodes,
            depth,
            tree_cost,
            draft_cost,
            context,
            self.overhead,
            pending=pending,
            per_node=self.per_node,
            plain_cost=plain_cost,
            chain_cost=chain_cost,
            chain_draft_cost=chain_draft,
            plain_overhead=self.plain_overhead,
            chain_overhead=(self.chain_overhead, self.chain_per_node),
            switch=switch,
            margin=DRAFT_MARGIN,
            **batch,
        )
        # a prior (from tune) stands for the tries; without one a few one-node tries come first
        if self.choice.nodes == 0 and self.prior is None and (counts.tries[0, 0] if counts.tries.size else 0) < EXPLORE:
            seconds = iteration_seconds(
                (1,), chain_cost, chain_draft, context, self.chain_overhead + self.chain_per_node, pending
            )
            self.choice = TreeChoice(1, 1, table.value(1, 1), seconds, (1,))
        self._use(table.tree(self.choice.nodes, self.choice.depth))
        if self.load is not None:  # told to the batch, for the other rows' prices
            self.load.chose(pending + self.choice.nodes, self.choice.tokens, len(self.choice.widths))

    def _rows(self) -> int:
        """The rows decoding in this row's batch (1 outside a batch): a change is news for the search."""
        return self.load.rows if self.load is not None else 1

    def _use(self, tree: TokenTree) -> None:
        """Propose `tree` from now on; what each proposal reads of it is read here, once per search."""
        self.tree = tree
        self._label = tree.describe() if tree.size else "none"
        self._widths, self._kind = tuple(tree.widths()), iteration_kind(tree)

    def _priced(self, kind: str) -> tuple[ForwardCost, ForwardCost | None]:
        """The target's and the draft's curves for an iteration of `kind` (chain or tree), scaled by its factors."""
        target, draft = self.factors[kind]
        curve = self.tree_cost if kind == "tree" else self.target_cost
        return curve.scaled(target), self.draft_cost.scaled(draft) if self.draft_cost is not None else None

    def _news(self, context: int) -> bool:
        """Whether a search could answer otherwise than the last: new verdicts, a context grown by
        CONTEXT_GROWTH, or (with `adapt`) this call's measured times, which move every iteration."""
        if self.adapt or self._searched is None:
            return True
        tries, searched_at, _ = self._searched  # a change of rows is news whatever the schedule (`propose`)
        return float(self.ranks().tries.sum()) != tries or context >= CONTEXT_GROWTH * searched_at

    def propose(self, context: list[int], shape: Shape) -> Proposal:
        self.calls += 1
        now, (on_target, on_draft) = time.perf_counter(), self.forward_seconds()
        if self.adapt and self._last is not None:  # the work between two proposals that was not a forward
            clock, target_before, draft_before, target_predicted, draft_predicted, kind = self._last
            spent_target, spent_draft = on_target - target_before, on_draft - draft_before
            other = max(0.0, (now - clock) - spent_target - spent_draft)
            if kind == "plain":
                self.plain_overhead = 0.8 * self.plain_overhead + 0.2 * other
            elif kind == "chain":
                other = max(0.0, other - self.chain_per_node * self.tree.size)
                self.chain_overhead = 0.8 * self.chain_overhead + 0.2 * other
            else:
                other = max(0.0, other - self.per_node * self.tree.size)
                self.overhead = 0.8 * self.overhead + 0.2 * other
            if self.calls >= 3:  # the first iteration's forwards hold the prompt
                factors = self.factors[kind]
                for i, (spent, predicted) in enumerate(
                    ((spent_target, target_predicted), (spent_draft, draft_predicted))
                ):
                    if predicted > 0 and spent > 0:
                        factors[i] = 0.8 * factors[i] + 0.2 * min(3.0, max(0.5, spent / predicted))
        if self.calls == 2:
            self._start = (now, len(context), self.one_time())
        # the first call's uncached tokens are the prompt, whose forward runs whatever the choice (a tree rides
        # on it): every choice is priced as a steady iteration's, with one token pending
        pending = min(self.pending(context), 1)
        searched = 0.0
        room = shape_depth(shape)
        if (
            (replans(self.calls) and self._news(len(context)))
            or self._probed
            or self.tree.max_depth > room
            or (self._searched is not None and self._searched[2] != self._rows())  # rows joined or left the batch
        ):
            self.search(len(context), pending, room, self.draft_behind(context) if self.draft_behind is not None else 1)
            searched = time.perf_counter() - now
            self.search_seconds += searched
        self._probed = False
        tree = self.tree
        if (
            not tree.size
            and self.calls % PROBE_EVERY == 0
            and (self.draft_behind is None or self.draft_behind(context) <= 2 * PROBE_EVERY)
        ):
            tree, self._probed = TokenTree.chain(1), True
            self.probes += 1
            self._use(tree)
        self.used[self._label] = self.used.get(self._label, 0) + 1
        if self.calls >= 2 and self.choice is not None:
            self.predicted_tokens += self.choice.tokens
            self.predicted_seconds += self.choice.seconds
        if self.adapt:
            # the next proposal measures the work since this point, drafting's Python included, search excluded
            widths, kind = self._widths, self._kind
            draft_predicted = (
                self.draft_cost(1, len(context)) + sum(self.draft_cost(w, len(context)) for w in widths[:-1])
                if widths and self.draft_cost is not None
                else 0.0
            )
            target_predicted = (self.tree_cost if kind == "tree" else self.target_cost)(
                pending + tree.size, len(context)
            )
            self._last = (now + searched, on_target, on_draft, target_predicted, draft_predicted, kind)
        if not tree.size:
            self._proposer = self.drafter
            return self.drafter.setup.empty()
        if self.chain is not None and tree.is_chain:
            self._proposer = self.chain
            return self.chain.propose(context, self._widths)
        self._proposer = self.drafter
        return self.drafter.propose(context, tree)

    def accept(self, verdict: Verdict) -> None:
        self._proposer.accept(verdict)

    def report(self, tokens: int) -> dict:
        seconds = time.perf_counter() - self._start[0] - (self.one_time() - self._start[2]) if self._start else 0.0
        decoded = tokens - self._start[1] if self._start else 0
        top = sorted(self.used.items(), key=lambda kv: -kv[1])[:5]
        return {
            "trees_used": dict(top),
            "tree_searches": self.searches,
            "tree_probes": self.probes,
            "tree_search_seconds": self.search_seconds,
            "predicted_tokens_per_second": (
                self.predicted_tokens / self.predicted_seconds if self.predicted_seconds else None
            ),
            "decode_tokens_per_second": decoded / seconds if decoded and seconds > 0 else None,
            "iteration_overhead_seconds": {
                "per_iteration": self.overhead,
                "per_node": self.per_node,
                "plain_step": self.plain_overhead,
                "chain": self.chain_overhead,
                "chain_per_node": self.chain_per_node,
                "measured": self.adapt,
            },
            "forward_factors": {
                kind: {"target": t, "draft": d} if kind != "plain" else {"target": t}
                for kind, (t, d) in self.factors.items()
            },
        }
