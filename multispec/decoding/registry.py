"""The method registry: each method module declares its `Method` (name, decode function, parameters with
their types, defaults, checks and help, exactness) beside its `decode`, and registers it here. `generate`,
the command line and the bench validate parameters from these declarations, so a new method needs no change
elsewhere."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..params import short_repr
from ..trees import parse_k_config

# The library's bounds on a method's sizes, so that one call cannot exhaust memory or time before it starts
# (a server sets tighter ones: `multispec.entrypoints.serve.Limits`). Trees are bounded by `trees.MAX_TREE_NODES`.
MAX_DEPTH = 256  # draft positions per target call (gamma, max_unchecked): a chain is a tree of this many nodes
MAX_ROWS = 64  # beams or draft chains: cache rows per model
MAX_NGRAM = 64  # the longest n-gram a copying drafter matches


@dataclass(frozen=True)
class Param:
    type: type
    default: Any
    check: Callable[[Any], bool] = lambda v: True
    rule: str = ""
    help: str = ""
    # a size (draft positions, rows, n-gram length): its largest value; servers bound every such parameter
    high: int | None = None
    # the value may name a file the method reads (a tree): refused where files must not be named (`resolve`)
    file: bool = False


def size(default: int | None, high: int, help: str, auto: bool = False) -> Param:
    """An integer parameter in [1, high] (or 'auto', with `auto`)."""
    if auto:
        return Param(
            IntOrAuto,
            default,
            lambda v: v == "auto" or 1 <= v <= high,
            f"an integer in [1, {high}] or 'auto'",
            help,
            high,
        )
    return Param(int, default, lambda v: 1 <= v <= high, f"an integer in [1, {high}]", help, high)


@dataclass(frozen=True)
class Method:
    name: str
    run: Callable
    needs_draft: bool
    exact: str
    summary: str
    params: dict[str, Param] = field(default_factory=dict)
    # runs only on the exact small test models (`MarkovLM`): never on a loaded model, never in bench defaults
    markov_only: bool = False
    # False for a method that only samples (no temperature-0 form): refused at temperature 0
    greedy: bool = True
    # the most cache entries one iteration adds past the committed ones to its row of either model, for resolved
    # parameters (a chain or tree with the uncached committed token, a draft's beam tree), or None where it holds
    # several cache rows: a method with one decodes in a row of a batch (`multispec.batching`)
    row_entries: Callable[[dict[str, Any]], int | None] | None = None

    def draft_use(self, params: dict[str, Any]) -> str:
        """'required', 'optional' (used where given: `drafter=hybrid`) or 'none' for resolved `params`."""
        if not self.needs_draft:
            return "none"
        drafter = params.get("drafter", "model")
        return {"model": "required", "hybrid": "optional"}.get(drafter, "none")

    def resolve(self, given: dict[str, Any], files: bool = True) -> dict[str, Any]:
        """Defaults filled in, types and ranges checked; ValueError naming the parameter otherwise. Without
        `files`, a parameter that could name a file takes inline values only: a text that is not one of its
        keywords is refused before anything is read, and the refusal does not depend on the file system."""
        out = {}
        for key, value in given.items():
            if key not in self.params:
                known = ", ".join(str(k) for k in self.params) or "none"
                raise ValueError(f"method {self.name!r} has no parameter {str(key)[:64]!r} (its parameters: {known})")
            spec = self.params[key]
            if spec.file and not files and isinstance(value, str) and value != "auto":
                raise ValueError(
                    f"{key} must be given inline here (a JSON list of parent indices or nested "
                    "lists, or 'auto'): file paths are not accepted"
                )
            if value is None and spec.default is None:  # "not set": the method derives it (e.g. from another)
                out[key] = None
                continue
            value = coerce(key, value, spec.type)
            if not spec.check(value):
                raise ValueError(f"{key} must be {spec.rule}, got {short_repr(value)}")
            out[key] = value
        for key, spec in self.params.items():
            out.setdefault(key, spec.default)
        for low, high in (
            ("min_ngram", "max_ngram"),
            ("min_width", "draft_width"),
            ("min_width", "beam_width"),
            ("beam_width", "draft_width"),
        ):
            if out.get(low) is not None and out.get(high) is not None and out[low] > out[high]:
                raise ValueError(f"{low} ({out[low]}) must not exceed {high} ({out[high]})")
        return out


def coerce(key: str, value: Any, kind: type) -> Any:
    """Parameters may arrive as strings from the CLI ("gamma=4"): convert, or name what is wrong."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{key} must be true or false, got {value!r}")
    if kind is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"{key} must be an integer, got {short_repr(value)}")
        if isinstance(value, str) and len(value) > 32:  # int() of a long digit string costs quadratic time
            raise ValueError(f"{key} must be an integer, got {short_repr(value)}")
        try:
            return int(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{key} must be an integer, got {short_repr(value)}") from None
    if kind is IntOrAuto:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            return coerce(key, value, int)
        except ValueError:
            raise ValueError(f"{key} must be an integer or 'auto', got {short_repr(value)}") from None
    if kind is float:
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{key} must be a number, got {short_repr(value)}") from None
        if not math.isfinite(number):
            raise ValueError(f"{key} must be a finite number, got {short_repr(value)}")
        return number
    if kind is str and not isinstance(value, str):
        raise ValueError(f"{key} must be text, got {short_repr(value)}")
    return value


class IntOrAuto:
    """Parameter type: an integer, or the string 'auto'."""


METHODS: dict[str, Method] = {}


def chain_entries(params: dict[str, Any]) -> int:
    """A chain's iteration (`Method.row_entries`): `gamma` drafts (its automatic most) and the committed token."""
    from ..models.cost import MAX_AUTO_GAMMA

    gamma = params.get("gamma", 0)
    return (MAX_AUTO_GAMMA if gamma == "auto" else int(gamma)) + 1


def register(method: Method) -> Method:
    if "draft_vocab" in method.params:
        method = replace(method, run=_with_draft_vocab(method.run))
    METHODS[method.name] = method
    return method


def _with_draft_vocab(run: Callable) -> Callable:
    """`run` taking `draft_vocab` too: the session's draft is reduced to it before the method starts (`generate`
    reduces it itself and passes none)."""

    @functools.wraps(run)
    def reduced(s, *args, draft_vocab: int | None = None, **params):
        if draft_vocab is not None:
            s.reduce_draft(draft_vocab)
        return run(s, *args, **params)

    return reduced


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}")
    return METHODS[name]


# parameters several methods share


def drafter_params(tree: bool = False) -> dict[str, Param]:
    """`drafter`, `min_ngram`, `max_ngram`: who drafts (see `multispec.drafting`)."""
    from ..drafting import DRAFTERS

    what = "the model's tree with the copied chain as one more branch" if tree else "the model elsewhere"
    return {
        "drafter": Param(
            str,
            "model",
            lambda v: v in DRAFTERS,
            " or ".join(repr(d) for d in DRAFTERS),
            "who drafts: the draft model, prompt lookup, suffix matching (no model needed), or "
            f"hybrid: a copy where the text repeats, {what}",
        ),
        "min_ngram": size(1, MAX_NGRAM, "shortest n-gram a copy may match"),
        "max_ngram": size(3, MAX_NGRAM, "longest n-gram a copy tries to match"),
        "draft_vocab": DRAFT_VOCAB,
    }


def _is_k_config(value) -> bool:
    try:
        parse_k_config(value)
    except ValueError:
        return False
    return True


def k_config_param(default: str, help: str) -> Param:
    return Param(
        object,
        default,
        _is_k_config,
        "branching factors >= 1 joined by 'x' (e.g. 4x2x2; depth = number of factors), at most 256 nodes",
        help,
    )


DRAFT_VOCAB = Param(
    int,
    None,
    lambda v: v >= 1,
    "an integer >= 1",
    "the draft proposes only its N most frequent tokens (its head cut to them: cheaper draft steps); the "
    "target's residual supplies every other token, so the output law is unchanged (`multispec.models.vocab`)",
)
BONUS = Param(bool, True, rule="true or false", help="sample a free target token after a fully accepted chain")
LENGTH_PENALTY = Param(
    float,
    1.0,
    lambda v: -10 <= v <= 10,
    "a number in [-10, 10]",
    "the answer is the beam with the highest log-likelihood / length ** this: 1 the mean "
    "per token (its perplexity), 0 the total (favours short answers)",
)
