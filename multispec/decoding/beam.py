"""`beam`: target-only beam sampling of width W (and deterministic beam search).

Each step scores every one-token extension (beam i, token v) by its joint log-likelihood
s_i + log p(v | beam i) under the unwarped target, warps that flattened [beams x V] vector jointly
(temperature, top-k, top-p) and draws W extensions from it with replacement (specs/seed-003 §3.1, B2).
Deterministic beam search keeps the W best extensions instead; temperature 0 means that too. A beam
ending in EOS is finished and leaves the active set; the output is the finished or final beam with the
highest joint log-likelihood / length ** `length_penalty` (`answer`). One target forward per step, all
beams in one batch: the hypotheses are the runner's cache rows (`feed_rows`), which follow the beams'
parents at each step (`commit_rows`).
"""

from __future__ import annotations

import torch

from ..engine import Session


def answer(candidates: list[tuple[float, list[int]]], length_penalty: float) -> list[int]:
    """The output among (joint log-likelihood, generated tokens) candidates: the highest
    log-likelihood / length ** length_penalty (transformers' name and formula). 1 (the default) ranks by
    the mean log-likelihood per token, the perplexity the outputs are judged by; 0 by the total, which
    favours short answers; values between trade the two."""
    return max(candidates, key=lambda c: c[0] / max(1, len(c[1])) ** length_penalty)[1]


def decode(s: Session, width: int = 4, deterministic: bool = False, length_penalty: float = 1.0) -> None:
    budget = s.budget()
    if budget <= 0:
        return
    deterministic = deterministic or s.sampling.greedy
    runner = s.target
    start = len(s.tokens)
    rows = [list(s.tokens)]  # the hypotheses: committed tokens, one cache row each
    logits = runner.feed_rows(rows)[:, -1]  # [1, V]: after the prompt
    device = logits.device
    scores = torch.zeros(1, dtype=logits.dtype, device=device)  # raw joint log-likelihoods
    finished: list[tuple[float, list[int]]] = []
    stops = torch.tensor(sorted(s.stop_tokens), dtype=torch.long, device=device)
    for step in range(budget):
        logp = torch.log_softmax(logits, dim=-1)
        joint = (scores[:, None] + logp).reshape(-1)
        if deterministic:
            picks = torch.topk(joint, min(width, int(torch.isfinite(joint).sum()))).indices
        else:
            weights = s.sampling.probs(joint)
            picks = torch.multinomial(weights, width, replacement=True, generator=s.generator)
        vocab = logp.shape[-1]
        parents, tokens = picks // vocab, picks % vocab
        scores = joint[picks]
        rows = [rows[p] + [t] for p, t in zip(parents.tolist(), tokens.tolist(), strict=True)]
        if stops.numel():
            ended = torch.isin(tokens, stops)
            finished += [(float(scores[i]), rows[i][start:]) for i in ended.nonzero().flatten().tolist()]
            keep = ~ended
            rows = [r for r, k in zip(rows, keep.tolist(), strict=True) if k]
            parents, scores = parents[keep], scores[keep]
        if not rows or step + 1 == budget:
            break
        runner.commit_rows(len(rows[0]), parents.tolist(), [[] for _ in rows])
        logits = runner.feed_rows(rows)[:, -1]
    candidates = finished + [(float(sc), r[start:]) for sc, r in zip(scores, rows, strict=True)]
    s.append(answer(candidates, length_penalty))
    s.counters["iterations"] += 1
