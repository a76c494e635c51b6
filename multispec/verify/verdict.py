"""The one result every verification rule returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """What a verifier decided about one proposal.

    accepted:   the accepted node indices in depth order, a path down from the root of the proposal's tree
                (a chain's first n drafts are nodes 0..n-1);
    tokens:     their token ids;
    next_token: the token drawn from the target after the accepted path (from the residual after a
                rejection, or the target's own row at a fully accepted path); None only when every draft
                passed and no bonus token was asked for;
    rejected:   whether the walk stopped at a rejection rather than at the end of the proposal;
    extra:      further independent draws from the target after the accepted path (beam layers that fill
                their width; see `beam_layer_verify`), empty for single-sequence rules.
    """

    accepted: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    next_token: int | None = None
    rejected: bool = False
    extra: tuple[int, ...] = ()

    @property
    def new_tokens(self) -> list[int]:
        return list(self.tokens) + ([] if self.next_token is None else [self.next_token])

    @classmethod
    def token(cls, token: int) -> Verdict:
        """A step with nothing proposed: just the target's next token."""
        return cls(next_token=int(token))
