"""Layer-by-layer verification of beam-sampled drafts (seed 003 DSBD, Algorithm 1 as corrected in the
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
then one candidate drawn from p', then fresh draws from target_beam up to `out_width`. Every output (and
every accepted draft of a passing layer) is then an independent draw from target_beam (seed 003,
Theorem 3.1). Children of rejected parents are rejected *and* update p' with the full draft_beam
(the spec's Convention A, §7 item 4): dropping them without renormalising draft_beam is biased.
"""

from __future__ import annotations

import torch

from ..warp import Sampling
from .chain import residual
from .verdict import Verdict


def beam_distribution(scores: torch.Tensor, logprobs: torch.Tensor, sampling: Sampling,
                      live: torch.Tensor | None = None) -> torch.Tensor:
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
    out_width: int,
    generator: torch.Generator | None = None,
) -> Verdict:
    """target_beam: [N], the target's beam distribution over this layer's candidates (0 on dead parents);
    draft_beam:  [N], the draft's, which `drafts` were drawn from i.i.d.;
    drafts:      [m] candidate indices, in draw order;
    live:        [m] bool, False for a draft whose parent was rejected (tested as a rejection);
    width:       acceptances the layer needs to pass (1 <= width <= m);
    out_width:   the width of the output layer when this layer fails (>= 1).
    Returns a Verdict: `accepted` the accepted draft positions (draw order), `tokens` their candidates,
    `rejected` whether the layer failed; when it failed, `next_token` the candidate drawn from p' and
    `extra` the fresh draws from target_beam that fill the output to `out_width`.
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
    tokens = tuple(int(drafts[j]) for j in accepted)
    if len(accepted) >= width:
        return Verdict(tuple(accepted), tokens)
    nxt = int(torch.multinomial(running.float(), 1, generator=generator)[0])
    fills = out_width - len(accepted) - 1
    extra = (tuple(torch.multinomial(target.float(), fills, replacement=True, generator=generator).tolist())
             if fills > 0 else ())
    return Verdict(tuple(accepted), tokens, nxt, True, extra)


def acceptance_count_law(target_beam: torch.Tensor, draft_beam: torch.Tensor, m: int) -> torch.Tensor:
    """[m + 1]: P(exactly k of m drafts are accepted) when all m are tested (seed 003 Eqs. 2-4).

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


def dynamic_width(target_beam: torch.Tensor, draft_beam: torch.Tensor, m: int, threshold: float,
                  min_width: int) -> int:
    """The width a layer must reach (seed 003 Eqs. 5-7): the largest K with P(at least K of the m drafts
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
    out_width: int,
    width_threshold: float = 0.0,
    min_width: int = 1,
    live: torch.Tensor | None = None,
    stops: frozenset[int] = frozenset(),
    generator: torch.Generator | None = None,
    layer_rule=None,
) -> tuple[int, list[tuple[int, int]], torch.Tensor, dict]:
    """Verify a draft forest layer by layer (seed 003 §3.2, step 3).

    scores:        [B] the input beams' joint target log-likelihoods;
    root_logprobs: [B, V] the target's unwarped log-probabilities after each input beam;
    layers:        per draft layer: `parents` [m] (positions in the layer before), `tokens` [m] and
                   `draft_beam` [P * V], the distribution the layer was drawn from (`ForestLayer`);
    node_logprobs: per draft layer [m, V]: the target's unwarped log-probabilities after each node;
    out_width:     the width of the output layer;
    live:          [B] bool, input beams that may be extended (default all);
    stops:         end-of-sequence tokens: an accepted draft that is one is a finished beam, not extended.
    out_width must be at least the draft count of every layer (the output layer holds the accepted drafts of
    a failing layer, then its one residual draw). Layer l needs `dynamic_width(..., width_threshold,
    min_width)` accepted drafts (threshold 0: all m).
    The first failing layer, or the one after the last draft layer, is the output layer: its `out_width`
    beams are independent draws from the target's beam distribution there (Theorem 3.1).
    Returns (d, outputs, output scores, info): the output layer's depth d (1 = children of the input
    beams; no outputs when every accepted beam of layer d - 1 ended), each output as (position of its
    parent in layer d - 1, token), their joint target log-likelihoods [out_width], and {'widths': asked per verified layer, 'accepted': per layer, 'drawn':
    the output drawn from the running distribution (a failed layer's residual draw, else the first),
    'finished': accepted drafts that ended their beam, as (layer, node, joint target log-likelihood)}.
    """
    layer_rule = layer_rule or beam_layer_verify
    logp = root_logprobs.double()
    live = torch.ones(scores.shape[0], dtype=torch.bool) if live is None else live.cpu()
    scores = scores.double().to(logp.device)
    widths, counts, finished = [], [], []
    vocab = logp.shape[-1]
    for d in range(1, len(layers) + 2):
        target_beam = beam_distribution(scores, logp, sampling, live.to(logp.device))
        if d > len(layers):  # every draft layer passed
            outputs = torch.multinomial(target_beam.float(), out_width, replacement=True, generator=generator).tolist()
            drawn = 0
            break
        layer = layers[d - 1]
        if out_width < layer.tokens.shape[0]:
            raise ValueError(f"out_width {out_width} is below the layer's {layer.tokens.shape[0]} drafts")
        at = layer.parents.cpu()
        drafts = at * vocab + layer.tokens.cpu()
        m = drafts.shape[0]
        width = m if width_threshold <= 0 else dynamic_width(target_beam, layer.draft_beam, m, width_threshold,
                                                            min_width)
        widths.append(width)
        verdict = layer_rule(target_beam, layer.draft_beam, drafts, live[at], width, out_width, generator)
        counts.append(len(verdict.accepted))
        if verdict.rejected:
            outputs = [*verdict.tokens, verdict.next_token, *verdict.extra]
            drawn = len(verdict.accepted)
            break
        accepted = torch.zeros(m, dtype=torch.bool)
        accepted[list(verdict.accepted)] = True
        scores = scores[at.to(scores.device)] + logp[at.to(logp.device), layer.tokens.to(logp.device)]
        logp = node_logprobs[d - 1].double()
        ended = torch.tensor([t in stops for t in layer.tokens.tolist()], dtype=torch.bool)
        finished += [(d, j, float(scores[j])) for j in (accepted & ended).nonzero().flatten().tolist()]
        live = accepted & ~ended
        if not live.any():  # every accepted beam ended: nothing left to extend
            return d, [], torch.empty(0, dtype=torch.float64), {"widths": widths, "accepted": counts,
                                                                "drawn": None, "finished": finished}
    joint = (scores[:, None] + logp).reshape(-1)
    pairs = [(c // vocab, c % vocab) for c in outputs]
    info = {"widths": widths, "accepted": counts, "drawn": drawn, "finished": finished}
    return d, pairs, joint[torch.tensor(outputs, device=joint.device)], info
