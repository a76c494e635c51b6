"""The one result every verification rule returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Beam:
    """One output hypothesis of a beam rule: it extends the hypothesis at position `parent` of the layer before
    (an input beam at the first layer) by `token`; `score` is its joint log-likelihood under the target."""

    parent: int
    token: int
    score: float = 0.0


@dataclass(frozen=True)
class Verdict:
    """What a verifier decided about one proposal.

    Single-sequence rules (chains, trees, joint and rollback rules):
    accepted:   the accepted node indices in depth order, a path down from the root of the proposal's tree
                (a chain's first n drafts are nodes 0..n-1);
    tokens:     their token ids;
    next_token: the token drawn from the target after the accepted path (from the residual after a
                rejection, or the target's own row at a fully accepted path); None only when every draft
                passed and no bonus token was asked for;
    rejected:   whether the walk stopped at a rejection rather than at the end of the proposal.

    Beam rules (`beam_layer_verify`, `forest_verify`) fill, besides `accepted` (positions of the accepted
    drafts, in draw order), `tokens` (their token ids) and `rejected` (a layer failed):
    beams:      the output layer's hypotheses, in order (accepted drafts first; see the rule);
    drawn:      the position in `beams` of the one drawn from the running (residual) distribution;
    depth:      the output layer (1: children of the input beams), for `forest_verify`;
    widths:     the width each verified layer needed; `layer_accepted`: the drafts each one accepted;
    finished:   accepted drafts that ended their hypothesis (a stop token), as (layer, node, Beam).
    """

    accepted: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    next_token: int | None = None
    rejected: bool = False
    beams: tuple[Beam, ...] = ()
    drawn: int | None = None
    depth: int = 0
    widths: tuple[int, ...] = ()
    layer_accepted: tuple[int, ...] = ()
    finished: tuple[tuple[int, int, Beam], ...] = ()

    @property
    def new_tokens(self) -> list[int]:
        return list(self.tokens) + ([] if self.next_token is None else [self.next_token])

    @classmethod
    def token(cls, token: int) -> Verdict:
        """A step with nothing proposed: just the target's next token."""
        return cls(next_token=int(token))
