"""The engine on exact Markov models: golden acceptance values, EOS, lengths, counters, determinism."""

import numpy as np
import pytest
import torch

from multispec import MarkovLM, Sampling, generate
from multispec.models.markov import random_markov_pair

EX1_TARGET = [0.5, 0.3, 0.2]
EX1_DRAFT = [0.2, 0.2, 0.6]


def context_free(row, vocab=3):
    return MarkovLM([row] * vocab)


def test_sequence_distribution_is_exact_and_normalised():
    t = MarkovLM([[[0.5, 0.5], [0.1, 0.9]], [[0.3, 0.7], [0.6, 0.4]]])
    outcomes, probs = t.sequence_distribution([1], 2)
    assert abs(float(probs.sum()) - 1) < 1e-12
    law = dict(zip(map(tuple, outcomes.tolist()), probs.tolist(), strict=True))
    # prompt token 1 at position 0: next ~ transitions[0][1], then transitions[1][x1]
    assert law[(1, 0)] == pytest.approx(0.9 * 0.6)
    assert law[(0, 1)] == pytest.approx(0.1 * 0.7)


@pytest.mark.parametrize("gamma, expected", [(1, 1.6), (2, 1.96), (4, (1 - 0.6**5) / 0.4)])
def test_golden_block_efficiency_on_context_free_pair(gamma, expected):
    # specs/MCSD §5.5 example 1: acceptance 0.6 per draft, tau = (1 - a^(g+1)) / (1 - a)
    target, draft = context_free(EX1_TARGET), context_free(EX1_DRAFT)
    per_iteration, drafted, accepted = [], 0, 0
    for seed in range(6):
        r = generate(target, draft, [0], method="sd", gamma=gamma, max_new_tokens=1500, seed=seed)
        s = r.stats
        drafted += s["drafted"]
        accepted += s["accepted"]
        per_iteration.append(s["new_tokens"] / s["target_calls"])
    # accepted/drafted is the per-position acceptance only at gamma 1 (drafts after a rejection are unseen)
    expected_rate = 0.6 if gamma == 1 else (expected - 1) / gamma
    assert abs(accepted / drafted - expected_rate) < 0.02
    tau = np.mean(per_iteration)
    assert abs(tau - expected) < 0.04, tau


def test_golden_acceptance_instance_a():
    # the theory spec §6.3 instance A: TV = 0.3, so acceptance 0.7 (the spec's p is our draft)
    target, draft = context_free([0.2, 0.3, 0.5]), context_free([0.5, 0.3, 0.2])
    s = generate(target, draft, [0], method="sd", gamma=1, max_new_tokens=6000, seed=3).stats
    assert abs(s["accepted"] / s["drafted"] - 0.7) < 0.02


def test_identical_models_accept_everything():
    t, _ = random_markov_pair(5, 40, seed=3)
    s = generate(t, t, [0], method="sd", gamma=4, max_new_tokens=30, seed=0).stats
    assert s["accepted"] == s["drafted"] and s["target_calls"] == 6


def test_counters_and_bounds():
    t, d = random_markov_pair(4, 60, seed=2)
    r = generate(t, d, [1], method="sd", gamma=3, max_new_tokens=50, seed=5)
    s = r.stats
    assert s["new_tokens"] == 50 == len(r.token_ids)
    assert s["target_calls"] == s["iterations"]
    assert s["draft_calls"] == s["drafted"]  # one draft forward per drafted token on a chain
    assert 0 <= s["accepted"] <= s["drafted"]
    assert 1 <= s["block_efficiency"] <= 4


@pytest.mark.parametrize("method, params", [("ar", {}), ("sd", {"gamma": 4}), ("beam", {"width": 3})])
def test_eos_ends_output_and_length_is_never_exceeded(method, params):
    # token 3 is EOS and fairly likely: blocks often contain it mid-way
    rows = [[0.3, 0.3, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25], [0.4, 0.2, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25]]
    target = MarkovLM(rows, eos_token_id=3)
    draft = MarkovLM([[0.25, 0.25, 0.25, 0.25]] * 4, eos_token_id=3)
    saw_eos = 0
    for seed in range(40):
        for budget in (1, 5, 9):
            r = generate(target, draft, [0], method=method, max_new_tokens=budget, seed=seed, **params)
            out = r.token_ids
            assert 1 <= len(out) <= budget
            assert 3 not in out[:-1]
            if out[-1] == 3:
                saw_eos += 1
                assert r.stats["stopped"] == "eos"
            else:
                assert len(out) == budget
    assert saw_eos > 20


def test_zero_new_tokens_returns_nothing():
    t, d = random_markov_pair(4, 10, seed=0)
    for method in ("ar", "sd", "beam"):
        r = generate(t, d, [0], method=method, max_new_tokens=0)
        assert r.token_ids == [] and r.stats["target_calls"] == 0


def test_context_limit_stops_generation():
    t, d = random_markov_pair(4, 6, seed=0)  # horizon 6: sequences of at most 7 tokens
    r = generate(t, d, [0, 1], method="sd", gamma=4, max_new_tokens=50)
    assert len(r.token_ids) == 5 and r.stats["stopped"] == "context"


def test_same_seed_same_output_and_seeds_differ():
    t, d = random_markov_pair(6, 40, seed=4)
    a = generate(t, d, [0], method="sd", max_new_tokens=30, seed=7).token_ids
    b = generate(t, d, [0], method="sd", max_new_tokens=30, seed=7).token_ids
    c = generate(t, d, [0], method="sd", max_new_tokens=30, seed=8).token_ids
    assert a == b and a != c


def test_greedy_sd_equals_greedy_ar_on_markov():
    t, d = random_markov_pair(6, 60, seed=9)
    ar = generate(t, None, [2], method="ar", temperature=0, max_new_tokens=50).token_ids
    for gamma in (1, 2, 5):
        assert generate(t, d, [2], method="sd", gamma=gamma, temperature=0, max_new_tokens=50).token_ids == ar


def test_deterministic_beam_search_with_full_width_finds_the_most_likely_sequence():
    t, _ = random_markov_pair(3, 4, seed=11)
    outcomes, probs = t.sequence_distribution([0], 3, Sampling())
    best = outcomes[int(torch.argmax(probs))].tolist()
    r = generate(t, None, [0], method="beam", width=9, deterministic=True, max_new_tokens=3)
    assert r.token_ids == best


def test_confidence_ends_draft_chains_early():
    target, draft = random_markov_pair(4, 40, seed=3)

    def run(**params):
        return generate(target, draft, [0], method="sd", max_new_tokens=30, seed=4, **params)

    full, one = run(gamma=3), run(gamma=1)
    # a threshold above every probability stops after each first draft: gamma 1, draw for draw
    capped = run(gamma=3, confidence=1.0)
    assert capped.token_ids == one.token_ids
    assert capped.stats["drafted"] == one.stats["drafted"] and capped.stats["iterations"] == one.stats["iterations"]
    # one below every probability never stops a chain: plain gamma 3, draw for draw
    assert run(gamma=3, confidence=1e-9).token_ids == full.token_ids
    # in between, some chains stop early and some run to gamma
    mid = run(gamma=3, confidence=0.4).stats
    assert mid["iterations"] < mid["drafted"] < 3 * mid["iterations"] - 2  # (the last chain may be cut by the budget)


def test_beams_answer_rule_is_the_length_penalty():
    # after 0: EOS (2) with 0.5, else 1 with 0.3; after 1: 1 again with 0.9. The one-token answer [EOS] has the
    # higher total log-likelihood (-0.69 against -1.41 for [1, 1, 1]), [1, 1, 1] the higher mean (-0.47)
    table = [[0.2, 0.3, 0.5], [0.05, 0.9, 0.05], [1 / 3, 1 / 3, 1 / 3]]
    t = MarkovLM(table, eos_token_id=2)
    kw = {"method": "beam", "width": 3, "deterministic": True, "max_new_tokens": 3}
    assert generate(t, None, [0], **kw).token_ids == [1, 1, 1]  # default 1: the mean per token
    assert generate(t, None, [0], length_penalty=0.0, **kw).token_ids == [2]
    assert generate(t, None, [0], length_penalty=1.0, **kw).token_ids == [1, 1, 1]
