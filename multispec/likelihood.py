"""How likely the target finds an output: the mean log-probability of the generated tokens under the
*unwarped* target, and perplexity. Shared by `generate` (its stats) and the bench."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from .models.base import LanguageModel


@torch.inference_mode()
def mean_logprob(target: LanguageModel, prompt_ids: list[int], output_ids: list[int]) -> float | None:
    """Mean log target(token | prefix) over the generated tokens (EOS included when emitted), under the
    unwarped target: a softmax at temperature 1 of raw logits, no top-k / top-p. One forward over
    prompt + output (but its last token) with a fresh cache; only the rows that predict output tokens are computed.
    None for an empty output."""
    if not output_ids:
        return None
    # the row after token i predicts token i + 1: the last output token is never fed (it predicts nothing
    # asked for, and a model may have no position for it)
    tokens = torch.tensor([list(prompt_ids) + list(output_ids)[:-1]], dtype=torch.long)
    n = len(output_ids)
    # a batch row's stand-in scores on its own row, emptied, so that the forward joins the batch as a prompt does
    cache = target.score_cache() if hasattr(target, "score_cache") else target.new_cache()
    logits = target.forward(cache, tokens, logits_to_keep=n)[0]
    logp = torch.log_softmax(logits.double(), dim=-1)
    picked = logp.gather(-1, torch.tensor(output_ids, device=logp.device)[:, None])
    return float(picked.mean())


def perplexity(mean_logprobs: Iterable[float | None]) -> float | None:
    """exp(-mean of the outputs' mean log-probabilities): one output's perplexity, or MTAD's aggregate
    over several (outputs without tokens left out)."""
    values = [v for v in mean_logprobs if v is not None]
    return math.exp(-sum(values) / len(values)) if values else None
