"""The drafter interface: `propose(context, shape) -> Proposal`, then `accept(verdict)`.

A drafter is asked for a proposal on the committed tokens (`context`) within a `shape`: a tuple of branching
factors (a k-config; a chain of g drafts is (1,) * g) or a `TokenTree` laid out breadth first. It may return a
smaller tree (a chain that stops early, a copy shorter than asked). After the target has verified the proposal,
the method hands the drafter the `Verdict`, whose node indices are the proposal's: a drafter that runs the draft
model keeps the accepted entries of that model's KV cache, which it alone feeds and commits, and drops the rest.
`options` lists the chains a drafter could propose now, for the draft length controller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..trees import Shape, TokenTree
from ..verify.verdict import Verdict
from ..warp import LazyRows, Sampling


@dataclass
class Proposal:
    tree: TokenTree
    tokens: torch.Tensor  # [N] token ids, node order
    # [R, V]: row 0 the root, row 1 + g node g, for every node with children; or a function that makes them,
    # called when `draft_probs` is first read (greedy drafts' rows: the greedy rules never read them); or
    # `LazyRows` (a chain's rows, made one by one: a rule that reads rows in order takes them as they are)
    draft_rows: torch.Tensor | Callable[[], torch.Tensor] | LazyRows
    live: torch.Tensor | None = None  # [N] bool: False for padding that must never be accepted; None: all live
    fixed: torch.Tensor | None = None  # [N] bool: nodes proposed deterministically (one-hot draft); None: none
    logq: torch.Tensor | None = None  # [N] a chain's cumulative joint draft log-probability (joint methods)

    @property
    def size(self) -> int:
        return self.tree.size

    @property
    def draft_probs(self) -> torch.Tensor:
        if isinstance(self.draft_rows, LazyRows):
            self.draft_rows = self.draft_rows.stacked()
        elif not isinstance(self.draft_rows, torch.Tensor):
            self.draft_rows = self.draft_rows()
        return self.draft_rows


@dataclass(frozen=True)
class Setup:
    """What every drafter of one generation shares: the sampling (draft and target are warped alike), the
    random generator, and the vocabulary and device proposals are laid out in."""

    sampling: Sampling
    generator: torch.Generator
    vocab_size: int
    device: torch.device

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        return self.sampling.draw(probs, self.generator)

    def empty(self) -> Proposal:
        """Nothing proposed: the iteration is a plain target step."""
        return Proposal(
            TokenTree.chain(0),
            torch.empty(0, dtype=torch.long, device=self.device),
            torch.empty(0, self.vocab_size, device=self.device),
        )


@dataclass
class Option:
    """One way to draft this iteration, for a controller that picks the length: `key` names the drafter
    (and what it matched) for its acceptance statistics, `length` is the most drafts it can give, `runner` the
    draft model's runner when drafting costs its forwards (None: free), and `make(g)` builds the chain of g."""

    key: str
    length: int
    runner: object | None
    make: Callable[[int], Proposal]


class Drafter:
    """Base of every drafter (module note)."""

    name = "drafter"

    def propose(self, context: list[int], shape: Shape) -> Proposal:
        """Draft on the committed tokens.

        Args:
            context: the committed tokens, prompt first.
            shape: what to propose at most: a k-config (a chain of g: (1,) * g) or a `TokenTree`, cut to the
                room left.

        Returns:
            A `Proposal`: a tree of N <= the shape's nodes, its tokens [N], and the draft rows [1 + N, V] each
            node's children were drawn from (warped as the target is; an empty tree: a plain target step).
        """
        raise NotImplementedError

    def accept(self, verdict: Verdict) -> None:
        """The verdict on this drafter's latest proposal. Drafters without state ignore it."""

    def options(self, context: list[int], depth: int) -> list[Option]:
        """The chains this drafter could propose now, up to `depth` tokens (see `Option`)."""
        return [Option(self.name, depth, getattr(self, "runner", None), lambda g: self.propose(context, (1,) * g))]
