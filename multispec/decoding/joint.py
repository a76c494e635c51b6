"""`mtad` (MTAD, Qin et al., 2024) and `mjsd` (MJSD, its first version): multi-token joint decoding
approximated with a draft model.

propose: `BeamDraft` beam-samples (mtad) or beam-decodes (mjsd) W beams for gamma steps on the draft and
         proposes the beam with the highest joint draft likelihood, with its cumulative log q;
score:   one target forward over the uncached committed token and the chain (no tree attention);
verify:  `joint_verify`: the longest prefix whose joint ratio target / draft passes tau, then one token
         from the target after it (no residual);
commit:  the session commits the target; the drafter keeps the chosen beam's entries of its beam tree.

Lossy by design: the claim of these papers is better text (lower perplexity under the target), not the
target's law. Switches where paper and authors' code differ:
- `beam_warp`: how the beam weights are warped. `joint` warps the beams' joint distribution over all W x V
  extensions (MTAD's Eq. 2; mtad's default, the paper's definition); `rows` warps each beam's row and then
  adds the beams' scores (the authors' code for both papers, and MJSD §2.1's candidates drawn from each
  beam's warped conditional; mjsd's default, its paper's definition).
- `ratio`: warped distributions on both sides (as both code bases do, the default) or the raw softmaxes
  of the papers' exposition. The beams are always drawn from, and ranked by, the distribution the ratio
  divides by, so a beam never passes through a token the draft's warped support excludes.
- `threshold`: strict `>` (the papers) or `>=` (the code).
With ratio=raw the extra token still comes from the warped target.
"""

from __future__ import annotations

import torch

from ..drafting import BeamDraft, setup_of
from ..drafting.beams import BEAM_WARPS
from ..engine import Entries, Session
from ..verify import joint_verify
from .loop import speculate
from .registry import DRAFT_VOCAB, MAX_DEPTH, MAX_ROWS, Method, Param, register, size


def decode_mtad(s: Session, *, gamma: int, width: int, tau: float, ratio: str, threshold: str, beam_warp: str) -> None:
    _joint(
        s,
        BeamDraft(s.draft_runner(), setup_of(s), width, deterministic=False, ratio=ratio, warp=beam_warp),
        gamma,
        tau,
        ratio,
        threshold,
    )


def decode_mjsd(s: Session, *, gamma: int, width: int, tau: float, ratio: str, threshold: str, beam_warp: str) -> None:
    _joint(
        s,
        BeamDraft(s.draft_runner(), setup_of(s), width, deterministic=True, ratio=ratio, warp=beam_warp),
        gamma,
        tau,
        ratio,
        threshold,
    )


def _joint(s: Session, drafter: BeamDraft, gamma: int, tau: float, ratio: str, threshold: str) -> None:
    def verify(proposal):
        logits = s.target.feed([s.tokens], Entries.chain(proposal.tokens))[0]  # [g + 1, V]
        warped = s.sampling.probs(logits)
        ratio_rows = torch.softmax(logits.double(), -1) if ratio == "raw" else warped
        return joint_verify(
            ratio_rows,
            proposal.logq,
            proposal.tokens,
            tau,
            s.generator,
            strict=threshold == "strict",
            next_probs=warped,
        )

    speculate(s, drafter, (1,) * gamma, verify)


def _joint_params(beam_warp: str) -> dict[str, Param]:
    return {
        "gamma": size(4, MAX_DEPTH, "tokens drafted per target call"),
        "width": size(8, MAX_ROWS, "draft beams W"),
        "tau": Param(
            float,
            0.1,
            lambda v: 0 <= v <= 1,
            "a number in [0, 1]",
            "a prefix passes when min(1, target joint / draft joint) > tau; 0 accepts any prefix the "
            "target allows, 1 none",
        ),
        "ratio": Param(
            str,
            "warped",
            lambda v: v in ("warped", "raw"),
            "'warped' or 'raw'",
            "distributions in the ratio: warped on both sides (the authors' code) or the plain "
            "softmaxes (the papers' exposition)",
        ),
        "threshold": Param(
            str,
            "strict",
            lambda v: v in ("strict", "non-strict"),
            "'strict' or 'non-strict'",
            "> tau (the paper) or >= tau (the authors' code)",
        ),
        "beam_warp": Param(
            str,
            beam_warp,
            lambda v: v in BEAM_WARPS,
            "'joint' or 'rows'",
            "warp the beams' joint distribution over W x V extensions (MTAD Eq. 2), or each "
            "beam's row before joining (the authors' code; MJSD §2.1)",
        ),
        "draft_vocab": DRAFT_VOCAB,
    }


def _beam_tree_entries(params: dict) -> int:
    """`Method.row_entries`: the draft's beams grow as a tree in its row, `width` nodes a position."""
    return int(params["width"]) * int(params["gamma"]) + 1


LOSSY = "lossy by design: joint-likelihood acceptance, judged by perplexity"
register(
    Method(
        "mtad",
        decode_mtad,
        needs_draft=True,
        exact=LOSSY,
        summary="multi-token assisted decoding: beam-sampled draft block, joint-ratio acceptance (MTAD)",
        row_entries=_beam_tree_entries,
        params=_joint_params("joint"),
    )
)
register(
    Method(
        "mjsd",
        decode_mjsd,
        needs_draft=True,
        exact=LOSSY,
        summary="multi-token joint speculative decoding: beam-decoded draft block, joint-ratio acceptance (MJSD)",
        row_entries=_beam_tree_entries,
        params=_joint_params("rows"),
    )
)
