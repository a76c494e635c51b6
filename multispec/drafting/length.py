"""Draft length that pays: `gamma=auto`'s controller, from the target's cost curve and the acceptance so far.

`DraftLength` keeps, per drafter key (the draft model, or a copying drafter and its match length) and per
position, how often a drafted token was accepted given that the ones before it were. For every option it
computes the expected tokens of drafting g tokens,

    E(g) = 1 + sum_{i <= g} prod_{j <= i} a_j      (a_j: acceptance at position j; the 1 is the bonus or
                                                    the replacement token)

and its cost T(g + 1) + draft forwards (`multispec.models.cost`) + the iteration's work besides forwards
(verifying, sampling drafts, committing: `overhead`, against `plain_overhead` for a plain step), and picks the
option and g (0 included: a plain target step) with the most tokens per second. The choice depends only on the
past and on the drafts themselves, never on the target's verification of this iteration, so exactness is
untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..models.cost import MAX_AUTO_GAMMA, ForwardCost
from ..verify.verdict import Verdict
from .base import Drafter, Option, Proposal

# the acceptance prior: a Beta(PRIOR_ACCEPT, PRIOR_REJECT) per position (mean 1/3), so that a drafter is tried
# before its record speaks, without the optimism that picking the best-looking option adds
PRIOR_ACCEPT, PRIOR_REJECT = 1.0, 2.0
EXPLORE = 3  # one-draft tries an option gets before the controller trusts its record


@dataclass
class Plan:
    option: Option | None  # None: no drafting this iteration
    length: int
    tokens: float  # expected tokens committed
    seconds: float  # predicted seconds (target forward + draft forwards)


@dataclass
class DraftLength:
    """The controller of `gamma=auto` (module note). `observe` after every verification."""

    target_cost: ForwardCost
    draft_cost: ForwardCost | None
    max_gamma: int = MAX_AUTO_GAMMA
    # seconds of work besides forwards: a drafting iteration's, and a plain step's (fixed prices, not the call's
    # clock: the same seed then gives the same choices, and the same tokens)
    overhead: float = 0.0
    plain_overhead: float = 0.0
    tries: dict[str, list[float]] = field(default_factory=dict)
    accepts: dict[str, list[float]] = field(default_factory=dict)
    # a sequence decoded in a batch (`multispec.batching.RowLoad`): prices are the batch's iteration and the
    # tokens all its rows commit, so that drafting shrinks as the batch fills
    load: Any = None

    def __post_init__(self):
        if self.load is not None:  # a row joining a batch starts from the batch's record, not from the prior
            for key, (tries, accepts) in self.load.pooled(self.max_gamma).items():
                self.tries[key], self.accepts[key] = tries, accepts

    def rates(self, key: str) -> list[float]:
        tries = self.tries.get(key, [0.0] * self.max_gamma)
        accepts = self.accepts.get(key, [0.0] * self.max_gamma)
        if tries[0] < EXPLORE and self.load is not None:  # a row that left the trying to others: the batch's record
            tries, accepts = self.load.pooled_record(key, tries, accepts)
        return [(a + PRIOR_ACCEPT) / (t + PRIOR_ACCEPT + PRIOR_REJECT) for a, t in zip(accepts, tries, strict=True)]

    def plan(self, options: list[Option], tokens: int, target_pending: int = 1) -> Plan:
        """The best option and length for a sequence of `tokens` tokens whose last `target_pending` the
        target has not cached yet. A draft model that lags (a copy drafted the last iterations) first feeds
        what it missed: its first forward covers those tokens. An available option whose first position has
        been tried fewer than EXPLORE times is tried with one draft first: without a record an option that
        costs more (the draft model) would never be chosen over one that costs nothing (a copy)."""
        longest = max((min(option.length, self.max_gamma) for option in options), default=0)
        load = None if self.load is None or self.load.alone else self.load  # a lone row prices as one sequence
        # T(target_pending + g) for every g in one read of the curve (this runs every iteration)
        # in a batch: the others' longest chain, its draft forwards' seconds, and the rows that would share them
        drafting, waiting, sharing = 0, 0.0, 1
        if load is None:
            target = self.target_cost.curve(target_pending + longest, tokens).tolist()
            others = [0.0] * (longest + 1)
        else:  # the batch's forward with this row this wide beside the others, and what the others commit
            target = load.target_curve(target_pending + longest)
            others = load.others(longest)
            drafting = load.others_drafting()
            waiting = drafting * load.draft_step(1)
            sharing = 1 + load.rows_drafting()
        best = Plan(None, 0, 1.0, target[target_pending] + self.plain_overhead + waiting)
        best_rate = (1.0 + others[0]) / best.seconds
        for option in options:
            a = self.rates(option.key)
            catch_up = 0
            if option.runner is not None and self.draft_cost is not None:
                catch_up = max(1, tokens - option.runner.committed)
                if load is None:
                    first, later = self.draft_cost(catch_up, tokens), self.draft_cost(1, tokens)
                else:
                    first, later = load.draft_step(catch_up), load.draft_step(1)
            survive, expected = 1.0, 1.0
            for g in range(1, min(option.length, self.max_gamma) + 1):
                survive *= a[g - 1]
                expected += survive
                seconds = target[target_pending + g] + self.overhead
                # the iteration's draft forwards: as many as the longest chain drafted, this row's or another's;
                # this row pays its share of those it drafts beside other rows (`RowLoad`)
                seconds += first + (max(g, drafting) - 1) * later if catch_up else waiting
                if catch_up and drafting:
                    seconds += min(g, drafting) * later / sharing
                if g == 1 and self._explores(option.key, load):
                    if load is not None:
                        load.explores(option.key)
                    return self._chose(Plan(option, 1, expected, seconds), target_pending)
                if (expected + others[g]) / seconds > best_rate:
                    best, best_rate = Plan(option, g, expected, seconds), (expected + others[g]) / seconds
        return self._chose(best, target_pending)

    def _explores(self, key: str, load) -> bool:
        """Whether this sequence tries option `key` with one draft now: its record of it is shorter than EXPLORE
        tries and, in a batch, its rows have not tried it EXPLORE times between them (those trying it now
        included). Rows that start together so share the trying instead of each paying for it: a draft model's
        first try feeds it the row's whole prompt, which in a batch cost more than the drafting won
        (docs/serving.md). The others price the option by the batch's record (`rates`)."""
        if self.tries.get(key, [0.0])[0] >= EXPLORE:
            return False
        return load is None or load.tried(key) < EXPLORE

    def _chose(self, plan: Plan, target_pending: int) -> Plan:
        """`plan`, told to the batch (`load.chose`) for the other rows' prices."""
        if self.load is not None:
            drafts = plan.length if plan.option is not None and plan.option.runner is not None else 0
            self.load.chose(target_pending + plan.length, plan.tokens, drafts)
        return plan

    def observe(self, key: str, drafted: int, accepted: int) -> None:
        tries = self.tries.setdefault(key, [0.0] * self.max_gamma)
        accepts = self.accepts.setdefault(key, [0.0] * self.max_gamma)
        for i in range(min(accepted + 1, drafted)):
            tries[i] += 1
        for i in range(accepted):
            accepts[i] += 1
        if self.load is not None:
            self.load.record(key, drafted, accepted)


class AutoLength(Drafter):
    """`gamma=auto` as a drafter: each iteration it asks `drafter` for its options (the draft model's chain,
    a copy and its length), lets the `DraftLength` controller pick one and a length within the room (zero
    included: nothing proposed, a plain target step), and proposes that; `accept` records the acceptance and
    passes the verdict on. `pending(context)`: the tokens the target has not cached yet (its first forward
    covers them). `report` gives the predicted and the measured decoding speed, leaving out the first
    iteration, which holds the prefill."""

    name = "auto"

    def __init__(
        self, drafter: Drafter, controller: DraftLength, setup, pending, one_time: Callable[[], float] = lambda: 0.0
    ):
        self.drafter, self.controller, self.setup, self.pending = drafter, controller, setup, pending
        self._plan: Plan | None = None
        self._size = 0
        self.used: dict[str, int] = {}
        self.predicted_tokens = self.predicted_seconds = 0.0
        self._calls = 0
        self._start: tuple[float, int, float] | None = None  # (time, tokens, one-time seconds) at the second iteration
        self.one_time = one_time  # one-time seconds so far (compiles mid-call are not decoding)

    def propose(self, context: list[int], shape: tuple[int, ...]) -> Proposal:
        self._calls += 1
        if self._calls == 2:
            self._start = (time.perf_counter(), len(context), self.one_time())
        options = self.drafter.options(context, len(shape)) if shape else []
        plan = self._plan = self.controller.plan(options, len(context), self.pending(context))
        kind = plan.option.key.split(":")[0] if plan.option is not None else "none"
        self.used[kind] = self.used.get(kind, 0) + 1
        if self._calls >= 2:
            self.predicted_tokens += plan.tokens
            self.predicted_seconds += plan.seconds
        proposal = self.setup.empty() if plan.option is None else plan.option.make(plan.length)
        self._size = proposal.size
        return proposal

    def accept(self, verdict: Verdict) -> None:
        if self._plan is not None and self._plan.option is not None:
            self.controller.observe(self._plan.option.key, self._size, len(verdict.accepted))
        self.drafter.accept(verdict)

    def report(self, tokens: int) -> dict:
        seconds = time.perf_counter() - self._start[0] - (self.one_time() - self._start[2]) if self._start else 0.0
        decoded = tokens - self._start[1] if self._start else 0
        return {
            "drafter_iterations": self.used,
            "predicted_tokens_per_second": (
                self.predicted_tokens / self.predicted_seconds if self.predicted_seconds else None
            ),
            "decode_tokens_per_second": decoded / seconds if decoded and seconds > 0 else None,
            "predicted_tokens": self.predicted_tokens,
            "decode_tokens": decoded,
            "predicted_seconds": self.predicted_seconds,
            "decode_seconds": seconds,
        }
