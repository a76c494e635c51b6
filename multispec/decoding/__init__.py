"""The methods: each a short module of propose -> score -> verify -> commit on the shared engine.

A method is registered with its parameters (name -> (type, default, check, help)); `generate` and the
CLI validate parameters from this table, so a new method needs no change elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..drafters import DRAFTERS
from ..trees import parse_k_config
from . import ar, beam, bild, dsbd, joint, mtjd, sd, tree


@dataclass(frozen=True)
class Param:
    type: type
    default: Any
    check: Callable[[Any], bool] = lambda v: True
    rule: str = ""
    help: str = ""


@dataclass(frozen=True)
class Method:
    name: str
    run: Callable
    needs_draft: bool
    exact: str
    summary: str
    params: dict[str, Param] = field(default_factory=dict)
    # internal keyword arguments (e.g. a verifier for tests); not exposed to the CLI
    hidden: tuple[str, ...] = ()
    # runs only on the exact small test models (`MarkovLM`): never on a loaded model, never in bench defaults
    markov_only: bool = False

    def draft_use(self, params: dict[str, Any]) -> str:
        """'required', 'optional' (used where given: `drafter=hybrid`) or 'none' for resolved `params`."""
        if not self.needs_draft:
            return "none"
        drafter = params.get("drafter", "model")
        return {"model": "required", "hybrid": "optional"}.get(drafter, "none")

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Defaults filled in, types and ranges checked; ValueError naming the parameter otherwise."""
        out = {}
        for key, value in given.items():
            if key in self.hidden:
                out[key] = value
                continue
            if key not in self.params:
                known = ", ".join(self.params) or "none"
                raise ValueError(f"method {self.name!r} has no parameter {key!r} (its parameters: {known})")
            spec = self.params[key]
            value = coerce(key, value, spec.type)
            if not spec.check(value):
                raise ValueError(f"{key} must be {spec.rule}, got {value!r}")
            out[key] = value
        for key, spec in self.params.items():
            out.setdefault(key, spec.default)
        for low, high in (("min_ngram", "max_ngram"), ("min_width", "draft_width")):
            if low in out and high in out and out[low] > out[high]:
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
            raise ValueError(f"{key} must be an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be an integer, got {value!r}") from None
    if kind is IntOrAuto:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            return coerce(key, value, int)
        except ValueError:
            raise ValueError(f"{key} must be an integer or 'auto', got {value!r}") from None
    if kind is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be a number, got {value!r}") from None
    return value


class IntOrAuto:
    """Parameter type: an integer, or the string 'auto'."""


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}")
    return METHODS[name]


register(Method("ar", ar.decode, needs_draft=False, exact="reference",
                summary="target-only sampling (greedy at temperature 0)"))
LENGTH_PENALTY = Param(float, 1.0, lambda v: -10 <= v <= 10, "a number in [-10, 10]",
                       "the answer is the beam with the highest log-likelihood / length ** this: 1 the mean "
                       "per token (its perplexity), 0 the total (favours short answers)")
register(Method("beam", beam.decode, needs_draft=False, exact="reference",
                summary="target-only beam sampling, or deterministic beam search",
                params={"width": Param(int, 4, lambda v: v >= 1, "an integer >= 1", "beam width W"),
                        "deterministic": Param(bool, False, rule="true or false",
                                               help="keep the W best extensions instead of sampling"),
                        "length_penalty": LENGTH_PENALTY}))
def drafter_params(tree: bool = False) -> dict[str, Param]:
    what = "the model's tree with the copied chain as one more branch" if tree else "the model elsewhere"
    return {
        "drafter": Param(str, "model", lambda v: v in DRAFTERS, " or ".join(repr(d) for d in DRAFTERS),
                         "who drafts: the draft model, prompt lookup, suffix matching (no model needed), or "
                         f"hybrid: a copy where the text repeats, {what}"),
        "min_ngram": Param(int, 1, lambda v: v >= 1, "an integer >= 1", "shortest n-gram a copy may match"),
        "max_ngram": Param(int, 3, lambda v: v >= 1, "an integer >= 1", "longest n-gram a copy tries to match"),
    }


def _gamma(v) -> bool:
    return v == "auto" or v >= 1


register(Method("sd", sd.decode, needs_draft=True, exact="equals ar in distribution",
                summary="speculative sampling with a chain of gamma drafts",
                params={"gamma": Param(IntOrAuto, 4, _gamma, "an integer >= 1 or 'auto'",
                                       "drafts per target call (at most); auto: chosen each call from the "
                                       "target's measured cost curve and the acceptance so far"),
                        "bonus": Param(bool, True, rule="true or false",
                                       help="sample a free target token after a fully accepted chain"),
                        "confidence": Param(float, 0.0, lambda v: 0 <= v <= 1, "a number in [0, 1]",
                                            "end a chain after a draft token the draft gave less than this "
                                            "probability (0: always gamma drafts)"),
                        **drafter_params()},
                hidden=("verify", "proposer")))
register(Method("sd-opt", sd.decode_relaxed, needs_draft=True, exact="biased when eps > 0 (eps = 0 is sd)",
                summary="over-accepting speculative sampling (seed 002 Decoding-OPT / UNO)",
                params={"gamma": Param(int, 4, lambda v: v >= 1, "an integer >= 1", "drafts per target call"),
                        "eps": Param(float, 0.1, lambda v: v >= 0, "a number >= 0",
                                     "over-acceptance: accept with min(1, (target + eps) / draft)"),
                        "resample": Param(str, "opt", lambda v: v in ("opt", "uno"), "'opt' or 'uno'",
                                          "on rejection: the optimal residual (opt) or the target (uno)"),
                        "bonus": Param(bool, True, rule="true or false")}))
def _is_k_config(value) -> bool:
    try:
        parse_k_config(value)
    except ValueError:
        return False
    return True


K_CONFIG_RULE = "branching factors >= 1 joined by 'x' (e.g. 4x2x2; depth = number of factors), at most 256 nodes"

register(Method("batch-sd", tree.decode_batch, needs_draft=True, exact="equals ar in distribution",
                summary="M independent draft chains verified together (seed 002 batch SD)",
                params={"drafts": Param(int, 4, lambda v: v >= 1, "an integer >= 1", "number of draft chains M"),
                        "gamma": Param(int, 4, lambda v: v >= 1, "an integer >= 1", "drafts per chain"),
                        "bonus": Param(bool, True, rule="true or false"),
                        **drafter_params(tree=True)}))
register(Method("mcsd", tree.decode_mcsd, needs_draft=True, exact="equals ar in distribution",
                summary="multi-candidate speculative decoding on a token tree (seed 004)",
                params={"k_config": Param(str, "4x2x1x1", _is_k_config, K_CONFIG_RULE,
                                          "children per node at each depth: 4x2x1x1 = 4 of the root, 2 of each"),
                        "replacement": Param(bool, False, rule="true or false",
                                             help="i.i.d. children (Algorithm 1) or draws without replacement "
                                                  "in draw order (Algorithm 2)"),
                        "tree_attention": Param(bool, True, rule="true or false",
                                                help="score the tree in one masked row; false: one batch row of "
                                                     "copied caches per root-to-leaf path (ablation)"),
                        "verifier": Param(str, "mcss", lambda v: v in ("mcss", "naive"), "'mcss' or 'naive'",
                                          "multi-candidate speculative sampling, or the naive MCNS baseline"),
                        **drafter_params(tree=True)},
                hidden=("rule",)))
register(Method("specinfer", tree.decode_specinfer, needs_draft=True, exact="equals ar in distribution",
                summary="SpecInfer's multi-step speculative sampling on its expansion tree",
                params={"k_config": Param(str, "1x1x3x1x1x1x1x1", _is_k_config, K_CONFIG_RULE,
                                          "expansion tree: children per node at each depth"),
                        "replacement": Param(bool, True, rule="true or false",
                                             help="i.i.d. children, or draws without replacement"),
                        **drafter_params(tree=True)}))


def _joint_params(deterministic: bool) -> dict[str, Param]:
    return {
        "gamma": Param(int, 4, lambda v: v >= 1, "an integer >= 1", "tokens drafted per target call"),
        "width": Param(int, 8, lambda v: v >= 1, "an integer >= 1", "draft beams W"),
        "tau": Param(float, 0.1, lambda v: 0 <= v <= 1, "a number in [0, 1]",
                     "a prefix passes when min(1, target joint / draft joint) > tau; 0 accepts any prefix the "
                     "target allows, 1 none"),
        "ratio": Param(str, "warped", lambda v: v in ("warped", "raw"), "'warped' or 'raw'",
                       "distributions in the ratio: warped on both sides (the authors' code) or the plain "
                       "softmaxes (the paper's exposition)"),
        "threshold": Param(str, "strict", lambda v: v in ("strict", "non-strict"), "'strict' or 'non-strict'",
                           "> tau (the paper) or >= tau (the authors' code)"),
    }


LOSSY = "lossy by design: joint-likelihood acceptance, judged by perplexity"
register(Method("mtad", joint.decode_mtad, needs_draft=True, exact=LOSSY,
                summary="multi-token assisted decoding: beam-sampled draft block, joint-ratio acceptance (seed 000)",
                params=_joint_params(False)))
register(Method("mjsd", joint.decode_mjsd, needs_draft=True, exact=LOSSY,
                summary="multi-token joint speculative decoding: beam-decoded draft block, joint-ratio acceptance "
                        "(seed 001)",
                params=_joint_params(True)))
register(Method("mtjd", mtjd.decode, needs_draft=False, exact="reference: the target's exact joint over blocks",
                summary="exact multi-token joint decoding by enumerating every block (MarkovLM test models only)",
                params={"gamma": Param(int, 4, lambda v: v >= 1, "an integer >= 1", "tokens per block"),
                        "bonus": Param(bool, False, rule="true or false",
                                       help="one token from the target after each block, as the joint methods "
                                            "draw one")},
                markov_only=True))
register(Method("bild", bild.decode, needs_draft=True, exact="lossy by design: the target keeps draft tokens it "
                "finds likely enough",
                summary="Big Little Decoder baseline: the target checks the draft when it is unsure (seeds 000/001)",
                params={"fallback": Param(float, 0.9, lambda v: 0 <= v <= 1, "a number in [0, 1]",
                                          "hand over to the target after a draft token drawn from a distribution "
                                          "whose largest probability is below this"),
                        "rollback": Param(float, 1.0, lambda v: v >= 0, "a number >= 0",
                                          "roll back at the first draft token whose -log target probability "
                                          "exceeds this"),
                        "max_unchecked": Param(int, 10, lambda v: v >= 1, "an integer >= 1",
                                               "draft tokens before the target checks them anyway")}))
register(Method("dsbd", dsbd.decode, needs_draft=True,
                exact="width_threshold=0 keeps beam's law (draft_width=1: ar's); a dynamic width changes the "
                      "schedule, one_cache keeps no known law",
                summary="dynamic-width speculative beam decoding: a draft forest from every beam, verified "
                        "layer by layer (seed 003)",
                params={"gamma": Param(int, 3, lambda v: v >= 1, "an integer >= 1", "draft layers per target call"),
                        "draft_width": Param(int, 3, lambda v: v >= 1, "an integer >= 1",
                                             "draft beams per layer W_S, and the beams kept"),
                        "width_threshold": Param(float, 0.7, lambda v: 0 <= v <= 1, "a number in [0, 1]",
                                                 "a layer needs the largest K with P(at least K drafts "
                                                 "accepted) >= this; 0: all draft_width (fixed width)"),
                        "min_width": Param(int, 1, lambda v: v >= 1, "an integer >= 1",
                                           "the least a layer must accept (W_min)"),
                        "one_cache": Param(bool, False, rule="true or false",
                                           help="keep one beam per iteration: one cache row per model"),
                        "output": Param(str, "best", lambda v: v in ("best", "sample"), "'best' or 'sample'",
                                        "with one_cache, the beam kept: the most likely under the target (the "
                                        "paper), or the drawn one (the authors' code)"),
                        "length_penalty": LENGTH_PENALTY},
                hidden=("layer_rule",)))
