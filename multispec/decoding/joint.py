"""`mtad` (seed 000) and `mjsd` (seed 001): multi-token joint decoding approximated with a draft model.

propose: `BeamDraft` beam-samples (mtad) or beam-decodes (mjsd) W beams for gamma steps on the draft and
         proposes the beam with the highest joint draft likelihood, with its cumulative log q;
score:   one target forward over the uncached committed token and the chain (no tree attention);
verify:  `joint_verify`: the longest prefix whose joint ratio target / draft passes tau, then one token
         from the target after it (no residual);
commit:  `Session.commit`, the draft keeping the chosen beam's entries of its beam tree.

Lossy by design: the claim of these papers is better text (lower perplexity under the target), not the
target's law. Switches where paper and authors' code differ: `ratio` (warped distributions on both sides,
as both code bases do, the default; or the raw softmaxes of the paper's exposition) and `threshold`
(strict `>`, the paper; or `>=`, the code). With ratio=raw the extra token still comes from the warped
target.
"""

from __future__ import annotations

import torch

from ..engine import Session
from ..proposers import BeamDraft
from ..verify import joint_verify
from .ar import draft_depths


def decode_mtad(s: Session, gamma: int = 4, width: int = 8, tau: float = 0.1, ratio: str = "warped",
                threshold: str = "strict") -> None:
    _joint(s, BeamDraft(width, deterministic=False, raw=ratio == "raw"), gamma, tau, ratio, threshold)


def decode_mjsd(s: Session, gamma: int = 4, width: int = 8, tau: float = 0.1, ratio: str = "warped",
                threshold: str = "strict") -> None:
    _joint(s, BeamDraft(width, deterministic=True, raw=ratio == "raw"), gamma, tau, ratio, threshold)


def _joint(s: Session, proposer: BeamDraft, gamma: int, tau: float, ratio: str, threshold: str) -> None:
    for g in draft_depths(s, gamma):
        proposal = proposer.propose(s, (1,) * g)
        logits = s.target.feed(s.tokens, proposal.tokens)  # [g + 1, V]
        warped = s.sampling.probs(logits)
        ratio_rows = torch.softmax(logits.double(), -1) if ratio == "raw" else warped
        verdict = joint_verify(ratio_rows, proposal.logq, proposal.tokens, tau, s.generator,
                               strict=threshold == "strict", next_probs=warped)
        s.commit(verdict, drafted=g, draft_entries=proposal.draft_entries)
