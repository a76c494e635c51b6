"""The exactness checker: run a method many times on random small Markov pairs and test the empirical
law of whole outputs against the exactly computed law of target sampling (chi-square goodness of fit).

Each pair is a random non-stationary (target, draft) Markov chain over a small vocabulary, or a pair of
`HistoryLM`s whose law depends on the whole prefix as read through the attention mask; every run generates
`n_tokens` tokens after a one-token prompt, so there are V**n_tokens possible outputs whose exact
probabilities come from `MarkovLM.sequence_distribution`. Cells whose expected count is under 5 are
pooled so the chi-square approximation holds. The check passes when every pair's p-value is at least
alpha / pairs (Bonferroni).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from scipy import stats

from ..api import generate
from ..batching import generate_batch
from ..models.markov import random_history_pair, random_markov_pair
from ..warp import Sampling


@dataclass
class PairResult:
    seed: int
    chi2: float
    dof: int
    p_value: float
    tv: float
    outcomes: int


@dataclass
class CheckReport:
    method: str
    params: dict
    runs: int
    vocab: int
    n_tokens: int
    models: str
    sampling: dict
    alpha: float
    pairs: list[PairResult]

    @property
    def passed(self) -> bool:
        return all(p.p_value >= self.alpha / len(self.pairs) for p in self.pairs)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["params"] = {k: v for k, v in self.params.items() if isinstance(v, (int, float, str, bool))}
        d["passed"] = self.passed
        return d


def chi_square(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson chi-square of observed counts against exact probabilities, pooling small cells."""
    n = counts.sum()
    expected = probs * n
    small = expected < min_expected
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    return chi2, dof, float(stats.chi2.sf(chi2, dof))


def check_method(
    method: str = "sd",
    runs: int = 20000,
    pairs: int = 3,
    vocab: int = 4,
    n_tokens: int = 3,
    seed: int = 0,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    alpha: float = 1e-3,
    concentration: float = 1.0,
    models: str = "markov",
    progress: bool = False,
    batch: int = 0,
    **method_params,
) -> CheckReport:
    """`runs` outputs of `method` on each of `pairs` random pairs, against the exact law (module note). `batch`:
    the runs decoded that many at a time, together (`generate_batch`: the rows of a batch, each with its own
    random stream), so that the law is checked as batched serving produces it."""
    if runs < 1 or pairs < 1 or vocab < 2 or n_tokens < 1:
        raise ValueError("runs and pairs must be >= 1, vocab >= 2 and n_tokens >= 1")
    sampling = Sampling(temperature, top_k, top_p)
    results = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=runs * pairs, desc=f"check {method}", unit="run")
    for i in range(pairs):
        pair_seed = seed * 1000 + i
        if models == "markov":
            target, draft = random_markov_pair(vocab, n_tokens + 1, pair_seed, concentration)
        elif models == "features":  # a feature-level draft head reading the target's (stand-in) hidden states
            target, draft = random_feature_pair(vocab, n_tokens + 1, pair_seed, concentration)
        elif models == "history":  # the law depends on the whole prefix, read through the attention mask
            target, draft = random_history_pair(vocab, pair_seed, concentration, max_length=n_tokens + 1)
        else:
            raise ValueError(f"models must be 'markov', 'features' or 'history', got {models!r}")
        prompt = [int(np.random.default_rng(pair_seed).integers(vocab))]
        _, exact = target.sequence_distribution(prompt, n_tokens, sampling)
        counts = np.zeros(vocab**n_tokens, dtype=np.int64)
        weights = vocab ** np.arange(n_tokens - 1, -1, -1)
        args = dict(max_new_tokens=n_tokens, temperature=temperature, top_k=top_k, top_p=top_p, score=False)
        for start in range(0, runs, max(1, batch)):
            first = pair_seed * 10**7 + start
            if batch:
                size = min(batch, runs - start)
                prompts = [prompt] * size
                outs = generate_batch(target, draft, prompts, method, seed=first, rows=size, **args, **method_params)
            else:
                outs = [generate(target, draft, prompt, method=method, seed=first, **args, **method_params)]
            for out in outs:
                if len(out.token_ids) != n_tokens:
                    raise AssertionError(f"{method} returned {len(out.token_ids)} tokens, expected {n_tokens}")
                counts[int(np.dot(out.token_ids, weights))] += 1
            if bar is not None:
                bar.update(len(outs))
        probs = exact.numpy()
        if (counts[probs == 0] > 0).any():
            chi2, dof, p = float("inf"), int((probs > 0).sum()) - 1, 0.0
        else:
            chi2, dof, p = chi_square(counts, probs)
        tv = 0.5 * float(np.abs(counts / runs - probs).sum())
        results.append(PairResult(pair_seed, chi2, dof, p, tv, int((probs > 0).sum())))
    if bar is not None:
        bar.close()
    return CheckReport(
        method,
        method_params,
        runs,
        vocab,
        n_tokens,
        models,
        {"temperature": temperature, "top_k": top_k, "top_p": top_p},
        alpha,
        results,
    )


def random_feature_pair(vocab: int, horizon: int, seed: int, concentration: float = 1.0):
    """A random Markov target with stand-in hidden states, and a random feature-level head (`models.eagle`) that
    reads them, whose draft vocabulary leaves one token out (its draft probability is 0: the residual supplies it)."""
    from ..models.eagle import EagleDraft, new_head

    target, _ = random_markov_pair(vocab, horizon, seed, concentration)
    target.hidden_size = 6
    kept = torch.arange(vocab)[torch.arange(vocab) != seed % vocab]
    head = new_head(target, draft_ids=kept, seed=seed)
    with torch.no_grad():  # a sharper random head: its drafts differ from one another, and from the target
        head.lm_head.weight.mul_(4.0)
    draft = EagleDraft(head.double(), target, name="feature-head")
    draft.token_counts = target.token_counts  # a ranking for `draft_vocab=N`
    return target, draft
