"""`dsbd`: dynamic-width speculative beam decoding (DSBD, Qin et al., 2024): beam sampling made fast by a
draft forest.

State: the hypotheses (`Hypotheses`): token rows of one length with their joint target log-likelihoods,
one cache row each in both models.
propose: `ForestDraft`: from every hypothesis the draft beam-samples `draft_width` (W_S) nodes per layer for
         `gamma` layers, i.i.d. from its jointly warped beam distribution, each node in its hypothesis'
         cache row (a tree per row);
score:   one target forward over the whole forest: one batch row per hypothesis, ancestor-only masks,
         positions by depth (`engine.Entries.lists`);
verify:  `forest_verify`: layer by layer, each layer's drafts tested against the target's beam
         distribution over the accepted nodes of the layer before (residual after a rejection, reset
         after an acceptance, children of rejected nodes rejected). A layer passes with W_L^(l) accepted
         drafts: `beam_width` (W_L) at `width_threshold=0`, else the largest K with P(at least K accepted)
         >= `width_threshold`, between `min_width` and W_L. The first failing layer is the output layer,
         filled to its W_L^(l) beams; after every layer passed, W_L beams are drawn after the last
         (Algorithm 1, lines 28-34). The output beams are independent draws from the target's beam
         distribution there;
commit:  the output beams become the hypotheses: the target's rows keep their paths' entries (two outputs
         of one row each get a copy), and so do the drafter's on `accept`. With `one_cache` only one is kept -
         `output`: 'best' (the paper: the most likely under the target) or 'sample' (the authors' code: the
         drawn one) - so both models hold one cache row (§3.6).

The answer is chosen as `beam` chooses (`Hypotheses.answer`, `length_penalty`). With `width_threshold=0` every
layer needs W_L beams and the hypotheses follow the law of `beam` of width W_L (Theorem 3.1);
`draft_width=beam_width=1` is `sd`. `one_cache` keeps no known law (a heuristic judged by perplexity).
Beam sampling has no temperature-0 form here: at temperature 0 dsbd is refused (use `beam`, whose
temperature 0 is beam search).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..drafting import ForestDraft, setup_of
from ..drafting.beams import Forest, grow_rows, outputs_in_rows
from ..engine import Entries, Hypotheses, Session
from ..verify import forest_verify
from .registry import DRAFT_VOCAB, LENGTH_PENALTY, MAX_DEPTH, MAX_ROWS, Method, Param, register, size


def decode(
    s: Session,
    *,
    gamma: int,
    draft_width: int,
    beam_width: int | None,
    width_threshold: float,
    min_width: int,
    one_cache: bool,
    output: str,
    length_penalty: float,
) -> None:
    beam_width = draft_width if beam_width is None else beam_width
    drafter = ForestDraft(s.draft_runner(), setup_of(s))
    hyps = Hypotheses(s)
    widths: list[int] = []
    while hyps.rows and hyps.room() > 0:
        g = min(gamma, hyps.room() - 1)
        forest = drafter.propose(hyps, (draft_width,) * g)
        logprobs, node_logprobs, target_paths = _score(s, hyps.rows, forest)
        verdict = forest_verify(
            hyps.scores,
            logprobs,
            forest.layers,
            node_logprobs,
            s.sampling,
            beam_width,
            width_threshold,
            min_width,
            stops=s.stop_tokens,
            generator=s.generator,
        )
        d = verdict.depth
        widths += verdict.widths
        s.count(d - 1, d <= g, drafted=g, nodes=g * draft_width)
        for layer, j, beam in verdict.finished:
            hyps.finish(beam.score, hyps.rows[forest.roots[layer - 1][j]] + _path(forest, layer, j))
        beams = verdict.beams
        if one_cache and beams:
            keep = max(range(len(beams)), key=lambda i: beams[i].score) if output == "best" else verdict.drawn
            beams = (beams[keep],)
        sources, _ = outputs_in_rows(forest.roots, target_paths, replace(verdict, beams=beams))
        going = []
        for beam, root in zip(beams, sources, strict=True):
            row = hyps.rows[root] + (_path(forest, d - 1, beam.parent) if d > 1 else []) + [beam.token]
            if beam.token in s.stop_tokens:
                hyps.finish(beam.score, row)
            else:
                going.append((beam, row))
        verdict = replace(verdict, beams=tuple(b for b, _ in going))
        if going:
            sources, target_kept = outputs_in_rows(forest.roots, target_paths, verdict)
            s.target.commit(len(going[0][1]), target_kept, sources)
            drafter.accept(verdict)
        hyps.rows = [row for _, row in going]
        hyps.scores = torch.tensor([b.score for b, _ in going], dtype=torch.float64)
    s.append(hyps.answer(length_penalty))
    s.info["mean_layer_width"] = sum(widths) / len(widths) if widths else None


def _score(s: Session, rows: list[list[int]], forest: Forest):
    """One target forward over the forest. Returns the log-probabilities after each hypothesis [B, V], after
    each node per layer ([m, V] each), and each node's path of target cache offsets in its row, per layer."""
    entries: list[list] = [[] for _ in rows]
    paths_by_layer, where = [], []
    previous: list[list[int]] = [[] for _ in rows]
    for d, layer in enumerate(forest.layers, start=1):
        previous, at = grow_rows(
            entries, forest.roots[d - 1], layer.tokens.tolist(), [previous[p] for p in layer.parents.tolist()], d
        )
        paths_by_layer.append(previous)
        where.append(at)
    # [B, 1 + S, V]; padding entries are never read
    logits = s.target.feed(rows, Entries.lists(entries, s.target.tentative))
    nodes = [torch.log_softmax(logits[row, 1 + index].double(), -1) for row, index in where]
    return torch.log_softmax(logits[:, 0].double(), -1), nodes, paths_by_layer


def _path(forest: Forest, layer: int, j: int) -> list[int]:
    """The tokens from layer 1 down to node j of `layer`."""
    tokens = []
    for d in range(layer, 0, -1):
        tokens.append(int(forest.layers[d - 1].tokens[j]))
        j = int(forest.layers[d - 1].parents[j])
    return tokens[::-1]


register(
    Method(
        "dsbd",
        decode,
        needs_draft=True,
        greedy=False,
        exact="width_threshold=0 keeps the law of beam of width beam_width (draft_width=beam_width=1: "
        "ar's); a dynamic width changes the schedule, one_cache keeps no known law",
        summary="dynamic-width speculative beam decoding: a draft forest from every beam, verified "
        "layer by layer (DSBD)",
        params={
            "gamma": size(3, MAX_DEPTH, "draft layers per target call"),
            "draft_width": size(3, MAX_ROWS, "draft beams per layer W_S"),
            "beam_width": size(
                None,
                MAX_ROWS,
                "beams kept W_L: the hypotheses per iteration and a fixed-width "
                "layer's acceptances; default draft_width, as the paper's "
                "experiments (the authors' code keeps W_S beams)",
            ),
            "width_threshold": Param(
                float,
                0.7,
                lambda v: 0 <= v <= 1,
                "a number in [0, 1]",
                "a layer needs the largest K with P(at least K drafts "
                "accepted) >= this, at most beam_width; 0: beam_width (fixed "
                "width)",
            ),
            "min_width": size(1, MAX_ROWS, "the least a layer must accept (W_min)"),
            "one_cache": Param(
                bool, False, rule="true or false", help="keep one beam per iteration: one cache row per model"
            ),
            "output": Param(
                str,
                "best",
                lambda v: v in ("best", "sample"),
                "'best' or 'sample'",
                "with one_cache, the beam kept: the most likely under the target (the "
                "paper), or the drawn one (the authors' code)",
            ),
            "length_penalty": LENGTH_PENALTY,
            "draft_vocab": DRAFT_VOCAB,
        },
    )
)
