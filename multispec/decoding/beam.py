"""`beam`: target-only beam sampling of width W (and deterministic beam search).

Each step scores every one-token extension (beam i, token v) by its joint log-likelihood
s_i + log p(v | beam i) under the unwarped target, warps that flattened [beams x V] vector jointly
(temperature, top-k, top-p) and draws W extensions from it with replacement (DSBD's beam sampling, §3.1).
Deterministic beam search keeps the W best extensions instead; temperature 0 means that too. A beam
ending in EOS is finished and leaves the active set; the output is the finished or final beam with the
highest joint log-likelihood / length ** `length_penalty` (`Hypotheses.answer`). One target forward per
step, all beams in one batch: the hypotheses are the runner's cache rows (`ModelRunner.feed`), which follow the
beams' parents at each step (`ModelRunner.commit`).
"""

from __future__ import annotations

import torch

from ..engine import Hypotheses, Session
from ..warp import categorical
from .registry import LENGTH_PENALTY, MAX_ROWS, Method, Param, register, size


def decode(s: Session, *, width: int, deterministic: bool, length_penalty: float) -> None:
    hyps = Hypotheses(s)
    if hyps.room() <= 0:
        return
    deterministic = deterministic or s.sampling.greedy
    runner = s.target
    logits = runner.feed(hyps.rows)[:, -1]  # [1, V]: after the prompt
    device = logits.device
    scores = torch.zeros(1, dtype=logits.dtype, device=device)  # raw joint log-likelihoods
    stops = torch.tensor(sorted(s.stop_tokens), dtype=torch.long, device=device)
    while True:
        logp = torch.log_softmax(logits, dim=-1)
        joint = (scores[:, None] + logp).reshape(-1)
        if deterministic:
            picks = torch.topk(joint, min(width, int(torch.isfinite(joint).sum()))).indices
        else:
            weights = s.sampling.probs(joint)
            picks = categorical(weights, s.generator, samples=width)
        vocab = logp.shape[-1]
        parents, tokens = picks // vocab, picks % vocab
        scores = joint[picks]
        rows = [hyps.rows[p] + [t] for p, t in zip(parents.tolist(), tokens.tolist(), strict=True)]
        if stops.numel():
            ended = torch.isin(tokens, stops)
            for i in ended.nonzero().flatten().tolist():
                hyps.finish(float(scores[i]), rows[i])
            keep = ~ended
            rows = [r for r, k in zip(rows, keep.tolist(), strict=True) if k]
            parents, scores = parents[keep], scores[keep]
        hyps.rows, hyps.scores = rows, scores.double().cpu()
        if not rows or hyps.room() <= 0:
            break
        runner.commit(len(rows[0]), sources=parents.tolist())
        logits = runner.feed(rows)[:, -1]
    s.append(hyps.answer(length_penalty))
    s.counters["iterations"] += 1


register(
    Method(
        "beam",
        decode,
        needs_draft=False,
        exact="reference",
        summary="target-only beam sampling, or deterministic beam search",
        params={
            "width": size(4, MAX_ROWS, "beam width W"),
            "deterministic": Param(
                bool, False, rule="true or false", help="keep the W best extensions instead of sampling"
            ),
            "length_penalty": LENGTH_PENALTY,
        },
    )
)
