"""What `generate` returns: the tokens, the text and `Stats`, the call's counts and times.

`Stats` is a typed dataclass that also reads as a mapping by the same names (`stats.seconds` or
`stats["seconds"]`), so the JSON `multispec generate --json` prints is `stats.as_dict()`: every field below,
in this order, then the method's own figures (`extra`: `gamma=auto`'s controller, `dsbd`'s layer widths).
Optional fields that were not measured (`rank_acceptance`, `mean_logprob`, `perplexity`) are left out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

# in the mapping only once set (`stats[key] = value`): measured only for some methods or calls
OPTIONAL = ("rank_acceptance", "mean_logprob", "perplexity")


@dataclass
class Stats(Mapping):
    """One generation's counts and times. `seconds` is the decoding time, the prompt's forward included, one-time
    costs (compiling a forward for a new shape, measuring a cost curve) not: those are `one_time_seconds`, and
    `wall_seconds` holds both."""

    new_tokens: int  # tokens generated
    target_calls: int  # target forwards, the prompt's included
    draft_calls: int  # draft forwards
    drafted: int  # draft positions proposed (a tree counts its depth)
    draft_nodes: int  # tokens proposed (a tree's nodes; equals drafted for chains)
    accepted: int  # draft tokens the target kept
    iterations: int  # propose -> score -> verify -> commit rounds
    rejections: int
    seconds: float  # decoding, the prompt's forward included, one-time costs not
    tokens_per_second: float
    wall_seconds: float  # the whole call
    one_time_seconds: float  # compiling, cost calibration
    # where the decoding time went: target forwards, draft forwards, everything else (drafting logic, warping,
    # sampling, verifying, committing)
    target_seconds: float
    prefill_seconds: float  # of target_seconds: the prompt's forward
    draft_seconds: float
    draft_prefill_seconds: float
    other_seconds: float
    compiles: int  # graphs compiled during this call (0 in steady state)
    graph_captures: int  # CUDA graphs captured during this call (0 in steady state)
    block_efficiency: float  # new tokens per target call
    acceptance_rate: float | None  # accepted / drafted; None when nothing was drafted
    forward_seconds: float  # target_seconds + draft_seconds
    # forwards by the tokens each fed ("rows x tokens per row" -> count): what a device's cost curve prices
    target_forwards: dict[str, int]
    draft_forwards: dict[str, int]
    stopped: str | None  # why the output ended: "eos", "length", "context", "stop", "cancelled"
    # iterations that accepted n drafts, at index n
    accepted_length_histogram: list[int]
    # per draft position: the iterations that accepted it, and the acceptance of those that reached it
    accepted_per_position: list[int]
    position_acceptance: list[float]
    # tree methods: per drafter and draw mode, by depth (rows) and sibling rank (columns): tries, accepts, and the
    # acceptance of the rank-i child given that the earlier ones were rejected
    rank_acceptance: dict[str, Any] | None = None
    # the output's mean log-probability and perplexity under the unwarped target (`generate(score=True)`)
    mean_logprob: float | None = None
    perplexity: float | None = None
    # compiled or captured steps that failed during this call and ran again without (one line each)
    fallbacks: list[str] = field(default_factory=list)
    # the method's own figures, by name
    extra: dict[str, Any] = field(default_factory=dict)
    # the optional fields that were set
    measured: set[str] = field(default_factory=set, repr=False, compare=False)

    def _names(self) -> list[str]:
        return [
            f.name for f in fields(self) if f.name in _MAPPED and (f.name not in OPTIONAL or f.name in self.measured)
        ]

    def __getitem__(self, key: str) -> Any:
        if key in _MAPPED and (key not in OPTIONAL or key in self.measured):
            return getattr(self, key)
        return self.extra[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key in _MAPPED:
            setattr(self, key, value)
            if key in OPTIONAL:
                self.measured.add(key)
        else:
            self.extra[key] = value

    def __iter__(self) -> Iterator[str]:
        yield from self._names()
        yield from self.extra

    def __len__(self) -> int:
        return len(self._names()) + len(self.extra)

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (for JSON), in field order, the method's own figures last."""
        return dict(self.items())


_MAPPED = {f.name for f in fields(Stats)} - {"extra", "measured"}


@dataclass
class Result:
    """One generation.

    Attributes:
        token_ids: the new tokens, [new_tokens].
        text: the new tokens decoded (None for a model without a tokenizer).
        stats: the call's counts and times (`Stats`).
        prompt_ids: the prompt as the target saw it, [prompt tokens] (after the chat template).
    """

    token_ids: list[int]
    text: str | None
    stats: Stats
    prompt_ids: list[int]
