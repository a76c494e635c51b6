"""Whole-output laws of the real decoders on random Markov pairs against the exact target law."""

import pytest
import torch

from multispec.tools.check import check_method
from tests.wrong_rules import no_residual_verify

RUNS = 3000


@pytest.mark.parametrize(
    "method, params, sampling",
    [
        ("ar", {}, {}),
        ("sd", {"gamma": 1}, {}),
        ("sd", {"gamma": 3}, {}),
        ("sd", {"gamma": 2}, {"temperature": 0.7, "top_k": 3, "top_p": 0.9}),
        ("sd", {"gamma": 3, "confidence": 0.4}, {}),  # chains of 1 to 3 drafts, ended by the draft
        ("sd", {"gamma": 3, "confidence": 0.4}, {"temperature": 0.6, "top_p": 0.9}),
        ("beam", {"width": 1}, {}),
        ("batch-sd", {"drafts": 3, "gamma": 2}, {}),
        ("batch-sd", {"drafts": 2, "gamma": 3, "bonus": False}, {"top_p": 0.8}),
        ("sd-opt", {"eps": 0.0, "gamma": 2}, {}),  # beam sampling of width 1 is multinomial sampling
    ],
)
@pytest.mark.slow
def test_exact_methods_pass(method, params, sampling):
    report = check_method(method, runs=RUNS, pairs=2, vocab=4, n_tokens=3, seed=1, **sampling, **params)
    assert report.passed, report.pairs
    assert all(p.tv < 4.6 / RUNS**0.5 for p in report.pairs)  # noise alone: ~3 / sqrt(runs) over 64 outcomes


def test_sd_without_residual_fails_the_same_check(monkeypatch):
    import multispec.decoding.sd

    monkeypatch.setattr(multispec.decoding.sd, "speculative_verify", no_residual_verify)
    report = check_method("sd", runs=RUNS, pairs=2, vocab=4, n_tokens=3, seed=1, gamma=2)
    assert not report.passed
    assert max(p.chi2 / p.dof for p in report.pairs) > 3


def test_beam_of_width_two_is_not_target_sampling():
    # beam sampling has another law; the checker must say so rather than pass everything
    report = check_method("beam", runs=RUNS, pairs=2, vocab=4, n_tokens=3, seed=1, width=2)
    assert not report.passed


def test_sd_opt_with_positive_eps_is_biased():
    report = check_method("sd-opt", runs=RUNS, pairs=2, vocab=4, n_tokens=3, seed=1, gamma=2, eps=0.3)
    assert not report.passed


@pytest.mark.parametrize(
    "method, params",
    [
        ("sd", {"gamma": 2}),
        ("sd", {"gamma": 3, "confidence": 0.5}),
        ("batch-sd", {"drafts": 3, "gamma": 2}),
        ("beam", {"width": 1}),
    ],
)
def test_exact_methods_pass_on_full_history_models(method, params):
    # HistoryLM reads its context through the mask and cache: tree and compaction mistakes change its law
    report = check_method(method, runs=3000, pairs=1, vocab=3, n_tokens=3, seed=2, models="history", **params)
    assert report.passed, report.pairs


def test_a_wrong_tree_mask_fails_on_full_history_models(monkeypatch):
    from multispec import engine

    right = engine._mask

    def other_chains_ancestors(n_pending, n_cached, sees):
        # known-wrong mask for two chains (node (d, m) at 2 (d - 1) + m): each node sees the other chain's
        # tokens where its own ancestors are (one token per position, so the model accepts it)
        _, n_rows, n_cols = sees.shape
        wrong = torch.zeros_like(sees)
        for r in range(n_rows):
            g = n_cols - n_rows + r
            for h in sees[0, r].nonzero().flatten().tolist():
                wrong[0, r, h if h == g else h ^ 1] = True
        return right(n_pending, n_cached, wrong)

    monkeypatch.setattr(engine, "_mask", other_chains_ancestors)
    report = check_method(
        "batch-sd", runs=3000, pairs=1, vocab=3, n_tokens=3, seed=2, models="history", drafts=2, gamma=2
    )
    assert not report.passed
