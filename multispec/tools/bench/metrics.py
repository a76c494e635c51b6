"""Per-output metrics (log-likelihood under the target, ROUGE-L, BLEU, exact match) and the summaries
used by the report (medians with quartiles, perplexity aggregated as in MTAD)."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

import numpy as np

from ...likelihood import mean_logprob as mean_logprob  # re-exported: the bench scores outputs with it
from ...likelihood import perplexity as perplexity

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
