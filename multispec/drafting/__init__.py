"""Drafting: every drafter proposes with `propose(context, shape) -> Proposal` and hears the verdict with
`accept(verdict)` (`base`). Drafters that run the draft model own its KV cache (`model`, `beams`); the copying
drafters need no model (`copying`); `length` is `gamma=auto`'s controller.

A new drafter is a `Drafter` subclass here, added to `DRAFTERS` and `make_drafter`.
"""

from __future__ import annotations

from ..engine import Session
from .base import Drafter, Option, Proposal, Setup
from .beams import BeamDraft, Forest, ForestDraft, ForestLayer
from .copying import Hybrid, Lookup, NgramIndex, Suffix, fixed_proposal
from .model import DraftChain, DraftTree, draw_children, sample_children, top_children

# the drafters a method's `drafter` parameter names
DRAFTERS = ("model", "lookup", "suffix", "hybrid")

__all__ = [
    "DRAFTERS",
    "BeamDraft",
    "DraftChain",
    "DraftTree",
    "Drafter",
    "Forest",
    "ForestDraft",
    "ForestLayer",
    "Hybrid",
    "Lookup",
    "NgramIndex",
    "Option",
    "Proposal",
    "Setup",
    "Suffix",
    "draw_children",
    "fixed_proposal",
    "make_drafter",
    "sample_children",
    "setup_of",
    "top_children",
]


def setup_of(s: Session) -> Setup:
    """The drafting setup of a generation: its sampling, generator, and the target's vocabulary and device."""
    return Setup(s.sampling, s.generator, s.target_model.vocab_size, s.target_model.device)


def make_drafter(
    drafter: str,
    s: Session,
    tree: bool,
    replacement: bool = False,
    confidence: float = 0.0,
    min_ngram: int = 1,
    max_ngram: int = 3,
) -> Drafter:
    """The drafter a method's `drafter` parameter names, for session `s`. `tree`: the method proposes trees
    (the model drafts with `DraftTree`), else chains (`DraftChain`)."""
    if drafter not in DRAFTERS:
        raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {drafter!r}")
    setup = setup_of(s)
    model = None
    if s.draft_model is not None and drafter in ("model", "hybrid"):
        runner = s.draft_runner()
        model = DraftTree(runner, setup, replacement) if tree else DraftChain(runner, setup, confidence)
    if drafter == "model":
        if model is None:
            raise ValueError("drafter 'model' needs a draft model; none was given")
        return model
    if drafter == "lookup":
        return Lookup(setup, min_ngram, max_ngram)
    if drafter == "suffix":
        return Suffix(setup, min_ngram, max_ngram)
    return Hybrid(Lookup(setup, min_ngram, max_ngram), model)
