"""Drafters that run beams on the draft model: `BeamDraft` (MTAD, MJSD: the best of W beams, as a chain) and
`ForestDraft` (DSBD: a draft forest from every hypothesis).

Both own the draft model's cache like the other model drafters (`multispec.drafting.model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..engine import Entries, Hypotheses, ModelRunner
from ..trees import TokenTree
from ..verify.beam import beam_distribution
from ..verify.verdict import Verdict
from ..warp import categorical, draw_without_replacement, draws_by_rows, largest, sequential_draws
from .base import Proposal, Setup
from .model import ModelDrafter

BEAM_WARPS = ("joint", "rows")


class Extensions(NamedTuple):
    """The W x V extensions (beam b, token v) of one beam step, flat index b * V + v.

    weights: [B * V] what the pick weighs them by: log-weights, -inf outside the warped support (`log`), or
             probabilities, 0 outside it (the joint warp's beam distribution, drawn from as it is);
    score:   [B] the beams' scores; an extension's beam score is score[b] + measure[b, v];
    measure: [B, V] the per-token term of the beam score (raw log q, or the row warp's log-conditional);
    step:    [B, V] the extension's step of log q for the ratio, or None: the beam distribution renormalised
             over the parent's extensions, weights[b, v] / mass[b], read only at the picks;
    mass:    [B] each parent's share of the beam distribution (with step None)."""

    weights: torch.Tensor
    log: bool
    score: torch.Tensor
    measure: torch.Tensor
    step: torch.Tensor | None
    mass: torch.Tensor | None = None

    def at(self, picks: torch.Tensor) -> tuple[list[float], list[float]]:
        """The picked extensions' beam scores and steps of log q, read in one gather each."""
        vocab = self.measure.shape[-1]
        beam, token = picks.div(vocab, rounding_mode="floor"), picks.remainder(vocab)
        score = (self.score[beam] + self.measure[beam, token]).tolist()
        if self.step is not None:
            return score, self.step[beam, token].tolist()
        mass = self.mass[beam]
        return score, torch.log(
            torch.where(mass > 0, self.weights[picks] / mass.clamp_min(1e-300), torch.zeros_like(mass))
        ).tolist()


class BeamDraft(ModelDrafter):
    """W beams for g steps on the draft model; the best beam is proposed as a chain, with `logq`, its
    cumulative joint log-probability under the distribution the joint test divides by.

    The beams grow as a tree in one cache row: the beams of depth d are nodes whose parents are beams of
    depth d - 1, and one draft forward per depth scores them with an ancestor-only mask (no cache copies).
    Each extension (beam b, token v) is weighted by one of two warps:
    - `warp="joint"` (MTAD's Eq. 2): the beams' raw joint log-likelihoods plus the raw log q(v | b), warped
      once over all W x V pairs (temperature, top-k, top-p on the joint, as `beam` does on the target);
    - `warp="rows"` (the MTAD/MJSD authors' code, and MJSD §2.1's candidates "drawn from the warped
      conditional"): each beam's row warped alone, the beams' cumulative warped log-probabilities added.
    Sampling (MTAD) draws W extensions without replacement from those weights; `deterministic` (MJSD's beam
    decoding) keeps the W heaviest. A weight of 0 is never picked, so a beam never leaves the warped support;
    a draw that runs out of support keeps fewer beams.
    `ratio`: "warped" makes `logq` the log of the warped conditionals the beams were drawn from (for
    `joint`, the beam distribution renormalised over each parent's extensions), "raw" the plain softmax;
    either is finite on every picked token, so the joint test never sees an infinite margin. The proposed
    beam is the final beam with the highest `logq`. At temperature 0 the warped rows are one-hot: the beams
    are a beam search on the raw draft, `logq` is raw, and the joint test against the one-hot target keeps
    the prefix that matches the target's greedy tokens whatever `logq` is.
    """

    name = "beam"

    def __init__(
        self,
        runner: ModelRunner,
        setup: Setup,
        width: int,
        deterministic: bool = False,
        ratio: str = "warped",
        warp: str = "joint",
    ):
        super().__init__(runner, setup)
        if warp not in BEAM_WARPS or ratio not in ("warped", "raw"):
            raise ValueError(f"warp must be one of {BEAM_WARPS} and ratio 'warped' or 'raw', got {warp!r}, {ratio!r}")
        self.width, self.deterministic, self.ratio, self.warp = width, deterministic, ratio, warp

    def propose(self, context: list[int], shape: tuple[int, ...]) -> Proposal:
        g = len(shape)
        self._start(context)
        if g == 0 or self._waits(context):
            return self.setup.empty()
        logits = self.runner.feed([context])[0, -1:]  # [1, V]: the root
        parents: list[int] = []  # beam tree, breadth first
        tokens: list[int] = []
        score_of: list[float] = []  # each node's beam score (the warp's measure of its path)
        logq_of: list[float] = []  # each node's cumulative log q (the ratio's measure of its path)
        beams = [-1]  # the nodes that are live beams (the root to start)
        for depth in range(1, g + 1):
            score = torch.tensor([0.0 if b < 0 else score_of[b] for b in beams], dtype=torch.float64)
            base = [0.0 if b < 0 else logq_of[b] for b in beams]
            if self._by_row_candidates:
                picks, picked_score, picked_step = self.heaviest(score.to(logits.device), logits)
            elif self._by_row_draws:
                picks, picked_score, picked_step = self.drawn(score.to(logits.device), logits)
            else:
                ext = self.extensions(score.to(logits.device), logits)
                picks = self._pick(ext.weights, len(beams), ext.log)
                picked_score, picked_step = ext.at(picks)
            start = len(tokens)
            vocab = logits.shape[-1]
            for flat, beam_score, step_q in zip(picks.tolist(), picked_score, picked_step, strict=True):
                b, v = divmod(flat, vocab)
                parents.append(beams[b])
                tokens.append(v)
                score_of.append(beam_score)
                logq_of.append(base[b] + step_q)
            beams = list(range(start, len(tokens)))
            if depth < g:  # the deepest level is never fed to the draft model
                tree = TokenTree.from_parents(parents)
                new = torch.tensor(tokens[start:], dtype=torch.long)
                logits = self.runner.feed([context], Entries.tree(tree, new, slice(start, len(tokens))))[
                    0, -len(beams) :
                ]
        best = max(beams, key=lambda n: logq_of[n])
        path = []
        node = best
        while node >= 0:
            path.append(node)
            node = parents[node]
        path.reverse()
        self._proposed(context, path)  # chain node i is the beam tree's entry path[i]
        device = self.setup.device
        chain = torch.tensor([tokens[n] for n in path], dtype=torch.long, device=device)
        logq = torch.tensor([logq_of[n] for n in path], dtype=torch.float64, device=device)
        return Proposal(TokenTree.chain(g), chain, torch.empty(0, self.setup.vocab_size, device=device), logq=logq)

    @property
    def _by_row_candidates(self) -> bool:
        """Whether the pick is the W heaviest of score[b] + a row's log-conditional, with every token in the
        support: then the W heaviest are among each row's W largest logits (the log-conditional is the logits
        less a per-row constant), and `heaviest` finds them without a [B, V] pass in float64. Not when greedy:
        there the pass over all extensions is one log-softmax and one top-k, as fast (and the by-row pick
        no faster, measured with benchmarks/iteration_work.py)."""
        sampling = self.setup.sampling
        return (
            not sampling.greedy
            and self.deterministic
            and self.warp == "rows"
            and self.ratio == "warped"
            and sampling.top_k == 0
            and sampling.top_p >= 1.0
        )

    def heaviest(self, score: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, list[float], list[float]]:
        """`_pick` + `Extensions.at` where `_by_row_candidates` holds: the W heaviest extensions of beams with
        `score` [B] by draft `logits` [B, V] (flat b * V + v, heaviest first; ties: the lower index first),
        their beam scores and their steps of log q (the temperature-warped log-conditional)."""
        t = self.setup.sampling.temperature
        z = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
        z = z / t if t != 1 else z
        vocab = z.shape[-1]
        values, index = largest(z, min(self.width, vocab))  # [B, w]: each row's candidates
        norm = _softmax_rows(z, probs=False)[1]  # [B]
        step = values.double() - norm[:, None]  # [B, w] log-conditionals of the candidates
        total = (score.double()[:, None] + step).reshape(-1)
        order = torch.sort(total, descending=True, stable=True).indices[: self.width]
        order = order[torch.isfinite(total[order])]
        beam = order.div(index.shape[-1], rounding_mode="floor")
        picks = beam * vocab + index.reshape(-1)[order]
        return picks, total[order].tolist(), step.reshape(-1)[order].tolist()

    @property
    def _by_row_draws(self) -> bool:
        """Whether sampled extensions weigh as a row's mass times its own distribution, so that `drawn` can
        draw them without warping all W x V of them at once: always for the row warp (each beam's warped row
        sums to 1), and for the joint warp without top-k or top-p (which would compare rows with each other)."""
        sampling = self.setup.sampling
        return (
            not self.deterministic
            and not sampling.greedy
            and (self.warp == "rows" or (sampling.top_k == 0 and sampling.top_p >= 1.0))
        )

    def drawn(self, score: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, list[float], list[float]]:
        """`_pick` + `Extensions.at` for sampled beams where `_by_row_draws` holds: W extensions of beams with
        `score` [B] by draft `logits` [B, V] drawn without replacement, their beam scores and steps of log q.
        The weights factor as mass[b] * row[b, v]:
        - row warp: exp(score[b] + log warped[b, v]) = exp(score[b]) * warped[b, v];
        - joint warp at temperature t: exp((score[b] + logp[b, v]) / t) = exp(score[b] / t) * sum_v p[b, v]^(1/t)
          * softmax(logits[b] / t)[v], p the raw conditional;
        so one softmax per row replaces a softmax over all W x V in float64, and the step of log q (the
        joint warp's distribution renormalised over a parent's extensions) is the row's own log-softmax."""
        sampling = self.setup.sampling
        x = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
        score = score.double()
        if self.warp == "rows":
            row = sampling.probs(x)  # [B, V], 0 outside each row's warped support
            log_mass = score
        else:
            t = sampling.temperature
            z = x / t if t != 1 else x
            row, norm = _softmax_rows(z)  # [B, V], [B]
            raw = norm if t == 1 else _softmax_rows(x, probs=False)[1]
            log_mass = score / t + norm - raw / t
        mass = torch.softmax(log_mass, -1).to(row.dtype)  # [B]
        if row.device.type == "cpu":  # the rows' sums, not one over all B x V weights
            live = mass > 0
            support = int(torch.count_nonzero(row if bool(live.all()) else row[live]))
            picks = draws_by_rows(row, mass, min(self.width, support), self.setup.generator)
        else:
            # [1, B * V]; the joint warp's rows are ours to scale in place, the row warp's are read again below
            weights = (row * mass[:, None] if self.warp == "rows" else row.mul_(mass[:, None])).reshape(1, -1)
            k = min(self.width, int(torch.count_nonzero(weights)))
            picks = sequential_draws(weights, k, self.setup.generator)[0][0]  # k <= the support: all draws live
        vocab = x.shape[-1]
        beam, token = picks.div(vocab, rounding_mode="floor"), picks.remainder(vocab)
        picked = x[beam, token].double()
        if self.warp == "rows":
            cond = torch.log(row[beam, token].double())
            step = cond if self.ratio == "warped" else picked - _softmax_rows(x, probs=False)[1][beam]
            return picks, (score[beam] + cond).tolist(), step.tolist()
        logp = picked - raw[beam]
        step = (z[beam, token].double() - norm[beam]) if self.ratio == "warped" else logp
        return picks, (score[beam] + logp).tolist(), step.tolist()

    def extensions(self, score: torch.Tensor, logits: torch.Tensor) -> Extensions:
        """The W x V extensions of beams with `score` [B] by draft `logits` [B, V] (see `Extensions`)."""
        logp = torch.log_softmax(logits.double(), -1)
        sampling = self.setup.sampling
        if sampling.greedy:
            return Extensions((score[:, None] + logp).reshape(-1), True, score, logp, logp)
        if self.warp == "rows":
            cond = torch.log(sampling.probs(logits).double())
            return Extensions(
                (score[:, None] + cond).reshape(-1), True, score, cond, cond if self.ratio == "warped" else logp
            )
        weights = beam_distribution(score, logp, sampling)  # [B * V] probabilities, 0 outside the warped support
        if self.ratio == "raw":
            return Extensions(weights, False, score, logp, logp)
        return Extensions(weights, False, score, logp, None, weights.view(logp.shape).sum(-1))

    def _pick(self, weights: torch.Tensor, rows: int = 1, log: bool = True) -> torch.Tensor:
        """W flat (beam, token) indices of `weights` [rows * V] (log-weights, -inf outside the support, or with
        `log=False` probabilities, 0 outside it): the heaviest (deterministic, or greedy sampling), or drawn
        without replacement in proportion to the weights; fewer when the support is smaller than W."""
        if self.deterministic or self.setup.sampling.greedy:
            # the W heaviest of all rows x V are among each row's W heaviest: a top-k per row (rows in
            # parallel) and one over the rows' W, instead of a top-k and a support scan over all of them
            by_row = weights.view(rows, -1)
            vocab = by_row.shape[-1]
            per_row = min(self.width, vocab)
            values, index = torch.topk(by_row, per_row, dim=-1)  # [rows, per_row]
            best = torch.topk(values.reshape(-1), min(self.width, values.numel()))
            picks = best.indices.div(per_row, rounding_mode="floor") * vocab + index.reshape(-1)[best.indices]
            return picks[torch.isfinite(best.values) if log else best.values > 0]
        # drawn over all rows x V at once: entries outside the support have weight 0 and are never drawn, and
        # zeros leave the cumulative sums (so the draws) as they are over the support alone
        if log:
            weights = torch.softmax(weights, -1)
        k = min(self.width, int(torch.count_nonzero(weights)))
        return draw_without_replacement(weights, k, self.setup.generator)


@dataclass
class ForestLayer:
    parents: torch.Tensor  # [m] each node's parent: a position in the previous layer (layer 1: an input beam)
    tokens: torch.Tensor  # [m]
    draft_beam: torch.Tensor  # [P * V] float64: the draft's beam distribution the layer was drawn from


@dataclass
class Forest:
    """A draft forest over several input beams (DSBD §3.2, step 1), layer by layer: the proposal of
    `ForestDraft`."""

    layers: list[ForestLayer]
    roots: list[list[int]]  # per layer, per node: the input beam (cache row) it descends from
    draft_paths: list[list[list[int]]]  # per layer, per node: the draft cache offsets of its fed path


class ForestDraft(ModelDrafter):
    """Beam sampling on the draft from every hypothesis: layer l holds `shape[l - 1]` nodes drawn i.i.d.
    (with replacement, kept in draw order) from the draft's beam distribution over (node of layer l - 1,
    token): the hypotheses' scores (their joint target log-likelihoods; the authors' code starts from 0:
    any weights keep the method exact, these make the draft's first layer agree with the target's where the
    models agree) plus the raw draft log-probabilities along the path, warped jointly. Every node of a
    layer is a parent at the next, whatever the target will say of it. Each node lives in its hypothesis'
    draft cache row, as a tree with an ancestor-only mask; one draft forward per layer but the last, over
    all rows. `accept` takes the verdict whose `beams` continue (`forest_verify`'s, less any the method
    drops): each keeps its path's cache entries, several from one row each get a copy."""

    name = "forest"

    def propose(self, context: Hypotheses, shape: tuple[int, ...]) -> Forest:
        rows, runner, setup = context.rows, self.runner, self.setup
        forest = Forest([], [], [])
        self._pending = (len(rows[0]), forest)
        if not shape or self._waits(rows[0]):
            return forest
        logits = runner.feed(rows)[:, -1]  # [B, V]: after each hypothesis
        scores = context.scores.double().to(logits.device)
        paths: list[list[int]] = [[] for _ in rows]
        roots = list(range(len(rows)))
        for d, width in enumerate(shape, start=1):
            logq = torch.log_softmax(logits.double(), -1)  # [P, V]
            vocab = logq.shape[-1]
            beam = beam_distribution(scores, logq, setup.sampling)
            picks = categorical(beam, setup.generator, samples=width)
            at, tokens = picks // vocab, picks % vocab
            scores = scores[at] + logq[at, tokens]
            roots = [roots[a] for a in at.tolist()]
            forest.layers.append(ForestLayer(at, tokens, beam))
            parent_paths = [paths[a] for a in at.tolist()]
            paths = parent_paths  # the deepest layer is never fed to the draft model
            if d < len(shape):
                entries: list[list] = [[] for _ in rows]
                paths, (row, index) = grow_rows(entries, roots, tokens.tolist(), parent_paths, d, runner.tentative)
                logits = runner.feed(rows, Entries.lists(entries, runner.tentative))[row, index]  # [width, V]
            forest.roots.append(roots)
            forest.draft_paths.append(paths)
        return forest

    def accept(self, verdict: Verdict) -> None:
        if self._pending is None or not verdict.beams:
            return
        length, forest = self._pending
        self._pending = None
        sources, kept = outputs_in_rows(forest.roots, forest.draft_paths, verdict)
        if self.refeeds:
            kept = [[] for _ in kept]
        self.runner.commit(length + verdict.depth, kept, sources)


def outputs_in_rows(roots: list[list[int]], paths: list[list[list[int]]], verdict: Verdict):
    """For each output beam of a forest verdict: the hypothesis (cache row) it continues and the cache
    entries of its path there. `roots` and `paths`: per layer, per node (`Forest.roots`, a cache's paths)."""
    d = verdict.depth
    if d == 1:
        return [b.parent for b in verdict.beams], [[] for _ in verdict.beams]
    return [roots[d - 2][b.parent] for b in verdict.beams], [paths[d - 2][b.parent] for b in verdict.beams]


def grow_rows(
    entries: list[list], roots: list[int], tokens: list[int], parent_paths: list[list[int]], depth: int, base: int = 0
) -> tuple[list[list[int]], tuple[torch.Tensor, torch.Tensor]]:
    """Lay one forest layer into per-row entry lists for `Entries.lists`: node j goes to row
    roots[j] at `depth`, seeing its parent's path parent_paths[j]. `base`: the runner's tentative entries
    before the call (offsets count from there). Returns each node's path of cache offsets (itself last)
    and where its logits come out of `ModelRunner.feed`: (row [m], index among the row's entries [m])."""
    paths, row, index = [], [], []
    for root, token, path in zip(roots, tokens, parent_paths, strict=True):
        entries[root].append((token, depth, tuple(path)))
        row.append(root)
        index.append(len(entries[root]) - 1)
        paths.append([*path, base + index[-1]])
    return paths, (torch.tensor(row, dtype=torch.long), torch.tensor(index, dtype=torch.long))


def _softmax_rows(z: torch.Tensor, probs: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """softmax over the last axis of float rows [B, V] (in their dtype; None with `probs=False`), and the
    log-normaliser log sum exp as float64 [B]: one pass of exponentials, shifted by each row's maximum (no
    overflow; the maximum counts 1). In float32 a token below ~1e-38 of its row's maximum weighs 0."""
    peak = z.amax(-1, keepdim=True)
    e = torch.exp(z - peak)
    total = e.sum(-1, keepdim=True)
    return e.div_(total) if probs else None, peak.double().squeeze(-1) + total.double().squeeze(-1).log()
