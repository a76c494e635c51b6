"""Per-output metrics (log-likelihood under the target, ROUGE-L, BLEU, exact match) and the summaries
used by the report (medians with quartiles, perplexity aggregated as in seed 000)."""

from __future__ import annotations

import math
import re
import string
from collections.abc import Iterable

import numpy as np
import torch

from ..models.base import LanguageModel


@torch.inference_mode()
def mean_logprob(target: LanguageModel, prompt_ids: list[int], output_ids: list[int]) -> float | None:
    """Mean log p_target(token | prefix) over the generated tokens (EOS included when emitted), under the
    *unwarped* target: a softmax at temperature 1 of raw logits, no top-k / top-p. One forward over
    prompt + output with a fresh cache; only the rows that predict output tokens are computed.
    None for an empty output."""
    if not output_ids:
        return None
    tokens = torch.tensor([list(prompt_ids) + list(output_ids)], dtype=torch.long)
    n = len(output_ids)
    # the row after token i predicts token i + 1: keep the n + 1 last rows and drop the final one
    logits = target.forward(target.new_cache(), tokens, logits_to_keep=n + 1)[0, :-1]
    logp = torch.log_softmax(logits.double(), dim=-1)
    picked = logp.gather(-1, torch.tensor(output_ids, device=logp.device)[:, None])
    return float(picked.mean())


def perplexity(mean_logprobs: Iterable[float | None]) -> float | None:
    """Seed 000's aggregate: exp(-mean over outputs of each output's mean log-prob)."""
    values = [v for v in mean_logprobs if v is not None]
    return math.exp(-sum(values) / len(values)) if values else None


_ROUGE = None


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure (rouge-score, default tokenizer: lower-cased alphanumeric words)."""
    global _ROUGE
    if _ROUGE is None:
        from rouge_score import rouge_scorer

        _ROUGE = rouge_scorer.RougeScorer(["rougeL"])
    return _ROUGE.score(reference, prediction)["rougeL"].fmeasure


def bleu(prediction: str, reference: str) -> float:
    """Sentence BLEU (sacrebleu, 0-100, with sacrebleu's default smoothing for sentences)."""
    import sacrebleu

    return sacrebleu.sentence_bleu(prediction, [reference]).score


def corpus_bleu(predictions: list[str], references: list[str]) -> float | None:
    import sacrebleu

    return sacrebleu.corpus_bleu(predictions, [references]).score if predictions else None


def normalise(text: str) -> str:
    """SQuAD-style answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalise(prediction) == normalise(reference))


def spread(values: Iterable[float | None]) -> dict | None:
    """Median with the quartiles and the count; None when there is no value."""
    v = np.array([x for x in values if x is not None], dtype=float)
    if not len(v):
        return None
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return {"median": float(med), "q1": float(q1), "q3": float(q3), "n": int(len(v))}
