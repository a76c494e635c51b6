"""Layer-by-layer verification of beam-sampled drafts (DSBD, Algorithm 1 as corrected in the
spec's §3.2), and the dynamic width (§3.4). Pure functions on beam distributions.

Glossary
- candidate: a pair (parent beam i, token v), flattened to the index i * V + v. Two candidates with the
  same text but different parents are different candidates.
- beam distribution [P * V]: the law beam sampling draws one candidate from: the parents' joint
  log-likelihoods plus the next-token log-probabilities, warped jointly over all P x V candidates
  (`beam_distribution`). `target_beam` is the target's, zero on parents that were not accepted;
  `draft_beam` the draft's, from which the drafts were drawn.
- drafts: m candidates drawn i.i.d. from `draft_beam`, tested in draw order (never sorted).

The rule, for one layer that needs `width` accepted drafts: keep a running distribution p' (starting at
target_beam); test each draft x in order: a draft whose parent was rejected is rejected outright, else it
is accepted with probability min(1, p'(x) / draft_beam(x)); after an acceptance p' is reset to
target_beam, after a rejection it becomes norm(max(p' - draft_beam, 0)). The layer passes once `width`
drafts are accepted (the rest count as rejected). If it fails, its output is the accepted candidates,
then one candidate drawn from p', then fresh draws from target_beam up to `width`. Every output (and
every accepted draft of a passing layer) is then an independent draw from target_beam (DSBD,
Theorem 3.1). Children of rejected parents are rejected *and* update p' with the full draft_beam
(the spec's Convention A, §7 item 4): dropping them without renormalising draft_beam is biased.
"""

from __future__ import annotations

import torch

from ..warp import Sampling, categorical
from .chain import residual
from .verdict import Beam, Verdict


def beam_distribution(
    scores: torch.Tensor, logprobs: torch.Tensor, sampling: Sampling, live: torch.Tensor | None = None
) -> torch.Tensor:
    """scores [P] (the parents' joint log-likelihoods), logprobs [P, V] (log next-token probabilities,
    unwarped) -> [P * V]: the warp (temperature, top-k, top-p) applied once, jointly, to the flattened
    joint log-likelihoods. `live` [P] bool: parents that may be extended (others get probability 0)."""
    joint = scores.double()[:, None] + logprobs.double()
    if live is not None:
        joint = joint.masked_fill(~live[:, None].to(joint.device), -torch.inf)
    return sampling.probs(joint.reshape(-1))


def beam_layer_verify(
    target_beam: torch.Tensor,
    draft_beam: torch.Tensor,
    drafts: torch.Tensor,
    live: torch.Tensor,
    width: int,
    vocab: int,
    generator: torch.Generator | None = None,
) -> Verdict:
    """target_beam: [P * V], the target's beam distribution over this layer's candidates (0 on dead parents);
    draft_beam:  [P * V], the draft's, which `drafts` were drawn from i.i.d.;
    drafts:      [m] candidate indices (parent * V + token), in draw order;
    live:        [m] bool, False for a draft whose parent was rejected (tested as a rejection);
    width:       W_L of this layer: the acceptances it needs to pass (1 <= width <= m), and the width of its
                 output when it fails;
    vocab:       V, to split candidates into (parent, token).
    Returns a Verdict: `accepted` the accepted draft positions (draw order), `tokens` their tokens,
    `rejected` whether the layer failed. `beams`: the accepted drafts; when the layer failed, then the one
    candidate drawn from p' (`drawn`, its token also `next_token`) and fresh draws from target_beam up to
    `width`. Scores are left at 0 (the caller knows the joint log-likelihoods).
    """
    target = target_beam.double()
    draft = draft_beam.double().to(target.device)
    running = target
    accepted: list[int] = []
    m = drafts.shape[0]
    u = torch.rand(m, generator=generator, dtype=torch.float64, device=target.device)
    for j, (x, alive) in enumerate(zip(drafts.tolist(), live.tolist(), strict=True)):
        if len(accepted) == width:
            break
        if alive and u[j] * draft[x] < running[x]:
            accepted.append(j)
            running = target
        else:
            running = residual(running, draft)
    outputs = [int(drafts[j]) for j in accepted]
    rejected = len(accepted) < width
    drawn = None
    if rejected:
        drawn = len(outputs)
        outputs.append(int(categorical(running, generator)))
        fills = width - len(outputs)
        if fills > 0:
            outputs += categorical(target, generator, samples=fills).tolist()
    beams = tuple(Beam(*divmod(c, vocab)) for c in outputs)
    return Verdict(
        tuple(accepted),
        tuple(b.token for b in beams[: len(accepted)]),
        beams[drawn].token if rejected else None,
        rejected,
        beams,
        drawn,
    )


def acceptance_count_law(target_beam: torch.Tensor, draft_beam: torch.Tensor, m: int) -> torch.Tensor:
    """[m + 1]: P(exactly k of m drafts are accepted) when all m are tested (DSBD Eqs. 2-4).

    alpha_j = sum min(p_j, draft) with p_1 = target_beam and p_{j+1} = norm(max(p_j - draft, 0)) (one
    residual update per step) is the chance that the j-th draft tested since the last acceptance passes;
    after an acceptance the sequence restarts at alpha_1."""
    target = target_beam.double()
    draft = draft_beam.double().to(target.device)
    alphas = []
    p = target
    for _ in range(m):
        alphas.append(float(torch.minimum(p, draft).sum()))
        p = residual(p, draft)
    # first[i - 1]: the first acceptance comes at the i-th draft
    first, missed = [], 1.0
    for a in alphas:
        first.append(missed * a)
        missed *= 1.0 - a
    law = [[1.0]]  # law[n][k]: k acceptances among n drafts
    for n in range(1, m + 1):
        row = [0.0] * (n + 1)
        row[0] = 1.0 - sum(first[:n])
        for k in range(1, n + 1):
            row[k] = sum(first[i - 1] * (law[n - i][k - 1] if k - 1 <= n - i else 0.0) for i in range(1, n + 1))
        law.append(row)
    return torch.tensor(law[m], dtype=torch.float64)


def dynamic_width(target_beam: torch.Tensor, draft_beam: torch.Tensor, m: int, threshold: float, min_width: int) -> int:
    """The width a layer must reach (DSBD Eqs. 5-7): the largest K with P(at least K of the m drafts
    accepted) >= threshold, at least `min_width`. threshold 0 gives m (fixed width)."""
    law = acceptance_count_law(target_beam, draft_beam, m)
    at_least = law.flip(0).cumsum(0).flip(0)  # at_least[K] = P(count >= K)
    best = max(k for k in range(m + 1) if k == 0 or at_least[k] >= threshold - 1e-12)
    return max(min_width, best)


def forest_verify(
    scores: torch.Tensor,
    root_logprobs: torch.Tensor,
    layers: list,
    node_logprobs: list[torch.Tensor],
    sampling: Sampling,
    beam_width: int,
    width_threshold: float = 0.0,
    min_width: int = 1,
    live: torch.Tensor | None = None,
    stops: frozenset[int] = frozenset(),
    generator: torch.Generator | None = None,
) -> Verdict:
    """Verify a draft forest layer by layer (DSBD §3.2, step 3; Algorithm 1).

    scores:        [B] the input beams' joint target log-likelihoods;
    root_logprobs: [B, V] the target's unwarped log-probabilities after each input beam;
    layers:        per draft layer: `parents` [m] (positions in the layer before), `tokens` [m] and
                   `draft_beam` [P * V], the distribution the layer was drawn from (`ForestLayer`);
    node_logprobs: per draft layer [m, V]: the target's unwarped log-probabilities after each node;
    beam_width:    W_L, the beams kept: a fixed-width layer needs W_L acceptances, and after every draft
                   layer passed, W_L beams are drawn (at most the drafts per layer);
    width_threshold, min_width: with a threshold above 0 a layer needs `dynamic_width(...)` acceptances
                   (W_L^(l), at least `min_width`, at most `beam_width`); 0: W_L (fixed width);
    live:          [B] bool, input beams that may be extended (default all);
    stops:         end-of-sequence tokens: an accepted draft that is one is a finished beam, not extended.
    The first failing layer l is the output layer, filled to its W_L^(l) beams; when every draft layer
    passed, the output layer is the one after the last, with W_L beams. Either way the output beams are
    independent draws from the target's beam distribution there (Theorem 3.1).
    Returns a Verdict: `depth` the output layer (1 = children of the input beams), `beams` the output beams
    (parent: position in layer depth - 1; score: joint target log-likelihood; none when every accepted
    beam of layer depth - 1 ended), `drawn`, `rejected` (a layer failed), `widths` and `layer_accepted`
    per verified layer, `finished` the accepted drafts that ended their beam.
    """
    logp = root_logprobs.double()
    live = torch.ones(scores.shape[0], dtype=torch.bool) if live is None else live.cpu()
    scores = scores.double().to(logp.device)
    widths, counts, finished = [], [], []
    vocab = logp.shape[-1]
    rejected = False
    for d in range(1, len(layers) + 2):
        target_beam = beam_distribution(scores, logp, sampling, live.to(logp.device))
        if d > len(layers):  # every draft layer passed
            outputs = categorical(target_beam, generator, samples=beam_width).tolist()
            drawn = 0
            break
        layer = layers[d - 1]
        at = layer.parents.cpu()
        drafts = at * vocab + layer.tokens.cpu()
        m = drafts.shape[0]
        if beam_width > m:
            raise ValueError(f"beam_width {beam_width} is above the layer's {m} drafts")
        width = (
            beam_width
            if width_threshold <= 0
            else min(beam_width, dynamic_width(target_beam, layer.draft_beam, m, width_threshold, min_width))
        )
        widths.append(width)
        verdict = beam_layer_verify(target_beam, layer.draft_beam, drafts, live[at], width, vocab, generator)
        counts.append(len(verdict.accepted))
        if verdict.rejected:
            outputs = [b.parent * vocab + b.token for b in verdict.beams]
            drawn, rejected = verdict.drawn, True
            break
        accepted = torch.zeros(m, dtype=torch.bool)
        accepted[list(verdict.accepted)] = True
        scores = scores[at.to(scores.device)] + logp[at.to(logp.device), layer.tokens.to(logp.device)]
        logp = node_logprobs[d - 1].double()
        ended = torch.tensor([t in stops for t in layer.tokens.tolist()], dtype=torch.bool)
        finished += [
            (d, j, Beam(int(at[j]), int(layer.tokens[j]), float(scores[j])))
            for j in (accepted & ended).nonzero().flatten().tolist()
        ]
        live = accepted & ~ended
        if not live.any():  # every accepted beam ended: nothing left to extend
            return Verdict(depth=d, widths=tuple(widths), layer_accepted=tuple(counts), finished=tuple(finished))
    joint = (scores[:, None] + logp).reshape(-1)
    beams = tuple(Beam(c // vocab, c % vocab, float(joint[c])) for c in outputs)
    return Verdict(
        rejected=rejected,
        beams=beams,
        drawn=drawn,
        depth=d,
        widths=tuple(widths),
        layer_accepted=tuple(counts),
        finished=tuple(finished),
    )
