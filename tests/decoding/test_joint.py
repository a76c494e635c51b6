"""Joint verification and the joint methods (`mtad`, `mjsd`): hand-built cases for the pure rule, the
properties of MTAD §4.1 and MJSD §4.6 on small Markov models, and the edge cases."""

import math

import numpy as np
import pytest
import torch

from multispec import generate
from multispec.drafting import BeamDraft, setup_of
from multispec.engine import Session
from multispec.models.markov import MarkovLM, random_markov_pair
from multispec.tools.check import check_method
from multispec.verify import joint_verify, rollback_verify
from multispec.warp import Sampling


def _rows(*rows):
    return torch.tensor(rows, dtype=torch.float64)


# -- the pure rule ------------------------------------------------------------------------------------------


def test_the_longest_passing_prefix_is_accepted_even_after_a_failing_one():
    # target probabilities of the drafts: 0.5, 0.01, 0.9, 0.9; draft joint: 0.5, 0.25, 0.2, 0.15
    target = _rows([0.5, 0.5, 0, 0], [0.01, 0.99, 0, 0], [0.9, 0.1, 0, 0], [0.9, 0.1, 0, 0], [0, 0, 1.0, 0])
    tokens = torch.tensor([0, 0, 0, 0])
    logq = torch.log(torch.tensor([0.5, 0.25, 0.2, 0.15], dtype=torch.float64))
    # joint ratios: 1, 0.02, 0.0225, 0.027 -> with tau 0.025 prefixes 1 and 4 pass, 2 and 3 fail
    v = joint_verify(target, logq, tokens, tau=0.025)
    assert v.accepted == (0, 1, 2, 3) and v.next_token == 2 and not v.rejected
    v = joint_verify(target, logq, tokens, tau=0.03)  # only prefix 1 passes
    assert v.accepted == (0,) and v.next_token in (0, 1) and v.rejected


def test_tau_at_least_one_accepts_nothing_and_zero_accepts_what_the_target_allows():
    target = _rows([0.5, 0.5], [0.0, 1.0], [0.3, 0.7])
    tokens, logq = torch.tensor([1, 0]), torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64))
    for strict in (True, False):
        assert joint_verify(target, logq, tokens, tau=1.0, strict=strict).accepted == ()
    # token 0 at position 2 has target probability 0: that prefix never passes, even at tau = 0
    assert joint_verify(target, logq, tokens, tau=0.0).accepted == (0,)


def test_strict_and_non_strict_thresholds_differ_only_at_equality():
    target = _rows([0.25, 0.75], [0.5, 0.5])
    tokens, logq = torch.tensor([0]), torch.log(torch.tensor([0.5], dtype=torch.float64))  # ratio exactly 0.5
    assert joint_verify(target, logq, tokens, tau=0.5, strict=True).accepted == ()
    assert joint_verify(target, logq, tokens, tau=0.5, strict=False).accepted == (0,)


def test_the_next_token_follows_the_target_row_after_the_prefix_without_residual():
    target = _rows([1.0, 0.0, 0.0], [0.2, 0.3, 0.5])
    tokens, logq = torch.tensor([0]), torch.tensor([0.0], dtype=torch.float64)  # the draft was sure
    counts = np.zeros(3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(4000):
        counts[joint_verify(target, logq, tokens, tau=0.5, generator=gen).next_token] += 1
    assert np.abs(counts / counts.sum() - [0.2, 0.3, 0.5]).max() < 0.03


def test_tau_is_monotone():
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        target = torch.softmax(torch.randn(5, 6, generator=gen, dtype=torch.float64) * 2, -1)
        tokens = torch.randint(6, (4,), generator=gen)
        logq = torch.log(torch.rand(4, generator=gen, dtype=torch.float64)).cumsum(0)
        lengths = [len(joint_verify(target, logq, tokens, tau=t).accepted) for t in (0.0, 0.05, 0.2, 0.6, 0.99)]
        assert lengths == sorted(lengths, reverse=True)


# -- the beam drafter ----------------------------------------------------------------------------------------


def _session(target, draft, prompt, sampling, seed=0):
    return Session(target, draft, prompt, sampling, 16, torch.Generator().manual_seed(seed))


def _beams(s, width, deterministic=False, ratio="warped", warp="joint"):
    return BeamDraft(s.draft_runner(), setup_of(s), width, deterministic, ratio, warp)


@pytest.mark.parametrize(
    "deterministic, raw, warp",
    [
        (False, False, "rows"),
        (True, False, "rows"),
        (True, True, "rows"),
        (False, True, "joint"),
        (True, True, "joint"),
    ],
)
def test_beam_draft_logq_is_the_joint_of_the_returned_path(deterministic, raw, warp):
    target, draft = random_markov_pair(5, 12, 3)
    sampling = Sampling(1.0, top_k=3)
    for seed in range(10):
        s = _session(target, draft, [2], sampling, seed)
        p = _beams(s, 4, deterministic, "raw" if raw else "warped", warp).propose(s.tokens, (1, 1, 1))
        tokens = [2] + p.tokens.tolist()
        fresh, total = [], 0.0
        for i in range(3):  # recomputed from the draft's tables, position by position
            logits = torch.log(draft.conditionals(i)[tokens[i]])
            row = torch.softmax(logits, -1) if raw else sampling.probs(logits)
            total += math.log(float(row[tokens[i + 1]]))
            fresh.append(total)
        assert np.allclose(p.logq.tolist(), fresh)


def test_beam_decoding_with_a_wide_beam_finds_the_joint_argmax():
    # W >= V^(g - 1) keeps every prefix alive: the best beam is the exact argmax of the draft's joint
    target, draft = random_markov_pair(3, 8, 5)
    s = _session(target, draft, [1], Sampling(1.0))
    p = _beams(s, 9, deterministic=True).propose(s.tokens, (1, 1, 1))
    outcomes, prob = draft.sequence_distribution([1], 3, Sampling(1.0))
    assert p.tokens.tolist() == outcomes[int(prob.argmax())].tolist()


@pytest.mark.parametrize("rows, vocab, width, finite", [(1, 50, 4, 50), (5, 40, 8, 200), (3, 30, 8, 5), (4, 6, 8, 24)])
def test_beam_decoding_keeps_the_heaviest_extensions_of_all_beams_and_none_outside_the_support(
    rows, vocab, width, finite
):
    # the pick by a top-k per row and one over the rows' candidates must be the top-k over all rows x V, with
    # -inf (outside the support) never picked; one beam with all the heavy entries, others empty, and fewer
    # finite entries than W are the edge cases
    target, draft = random_markov_pair(3, 8, 2)
    s = _session(target, draft, [1], Sampling(1.0))
    beams = _beams(s, width, deterministic=True)
    gen = torch.Generator().manual_seed(rows * vocab + width)
    for trial in range(20):
        weights = torch.randn(rows * vocab, generator=gen, dtype=torch.float64)
        if trial % 2:  # the heaviest entries all in the first beam
            weights[:vocab] += 10
        outside = torch.randperm(rows * vocab, generator=gen)[finite:]
        weights[outside] = -math.inf
        picked = beams._pick(weights, rows)
        expected = torch.topk(weights, min(width, finite)).indices
        assert sorted(picked.tolist()) == sorted(expected.tolist())
        assert picked.unique().numel() == picked.numel()
        assert torch.equal(weights[picked], weights[picked].sort(descending=True).values)  # heaviest first
        # the same weights as probabilities (0 outside the support), as the joint warp hands them over
        assert torch.equal(beams._pick(weights.exp(), rows, log=False), picked)


@pytest.mark.parametrize("temperature, dtype", [(1.0, torch.float32), (0.7, torch.float32), (0.7, torch.float64)])
@pytest.mark.parametrize("rows, width", [(1, 8), (3, 4), (8, 8), (5, 1)])
def test_the_by_row_pick_equals_the_pick_over_all_extensions(temperature, dtype, rows, width):
    # `heaviest` looks only at each row's W largest logits; it must pick what the pass over all rows x V picks,
    # with the same beam scores and steps of log q
    target, draft = random_markov_pair(3, 8, 2)
    s = _session(target, draft, [1], Sampling(temperature))
    beams = _beams(s, width, deterministic=True, warp="rows")
    assert beams._by_row_candidates
    gen = torch.Generator().manual_seed(rows * 10 + width)
    for _ in range(10):
        logits = (3 * torch.randn(rows, 300, generator=gen)).to(dtype)
        score = torch.randn(rows, generator=gen, dtype=torch.float64) * 2
        picks, scores, steps = beams.heaviest(score, logits)
        ext = beams.extensions(score, logits)
        expected = beams._pick(ext.weights, rows, ext.log)
        expected_scores, expected_steps = ext.at(expected)
        assert picks.tolist() == expected.tolist()
        assert np.allclose(scores, expected_scores, atol=1e-5) and np.allclose(steps, expected_steps, atol=1e-5)
        assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize(
    "warp, sampling",
    [
        ("joint", Sampling(1.0)),
        ("joint", Sampling(0.7)),
        ("rows", Sampling(1.0)),
        ("rows", Sampling(0.8, top_k=50, top_p=0.9)),
    ],
)
@pytest.mark.parametrize("ratio", ["warped", "raw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_by_row_draws_are_the_draws_over_all_extensions(warp, sampling, ratio, dtype):
    # `drawn` factors the weights as a row's mass times its own distribution; with the same uniforms it must
    # draw what the draw over all rows x V draws, with the same beam scores and steps of log q
    target, draft = random_markov_pair(3, 8, 2)
    s = _session(target, draft, [1], sampling)
    beams = _beams(s, 6, deterministic=False, ratio=ratio, warp=warp)
    assert beams._by_row_draws and not beams._by_row_candidates
    gen = torch.Generator().manual_seed(7)
    for trial in range(20):
        rows = 1 + trial % 5
        logits = (3 * torch.randn(rows, 200, generator=gen)).to(dtype)
        score = torch.randn(rows, generator=gen, dtype=torch.float64) * 2
        beams.setup.generator.manual_seed(trial)
        picks, scores, steps = beams.drawn(score, logits)
        beams.setup.generator.manual_seed(trial)
        ext = beams.extensions(score, logits)
        expected = beams._pick(ext.weights, rows, ext.log)
        expected_scores, expected_steps = ext.at(expected)
        assert picks.tolist() == expected.tolist()
        assert np.allclose(scores, expected_scores, atol=1e-5) and np.allclose(steps, expected_steps, atol=1e-5)


def test_the_by_row_pick_is_kept_to_settings_where_every_token_is_a_candidate():
    target, draft = random_markov_pair(3, 8, 2)
    s = _session(target, draft, [1], Sampling(1.0, top_k=3))
    assert not _beams(s, 4, deterministic=True, warp="rows")._by_row_candidates  # top-k cuts the support
    s = _session(target, draft, [1], Sampling(1.0))
    assert not _beams(s, 4, deterministic=False, warp="rows")._by_row_candidates  # sampled beams
    assert not _beams(s, 4, deterministic=True, warp="joint")._by_row_candidates  # the joint warp
    assert _beams(s, 4, deterministic=True, warp="rows")._by_row_candidates
    s = _session(target, draft, [1], Sampling(0.0))
    assert not _beams(s, 4, deterministic=True, warp="rows")._by_row_candidates  # greedy: no faster (s41)
    # top-p on the joint warp compares rows with each other: their weights do not factor by row
    s = _session(target, draft, [1], Sampling(1.0, top_p=0.9))
    assert not _beams(s, 4, deterministic=False, warp="joint")._by_row_draws
    assert _beams(s, 4, deterministic=False, warp="rows")._by_row_draws


def test_beam_sampling_of_width_one_is_ancestral_sampling_from_the_draft():
    target, draft = random_markov_pair(3, 8, 6)
    outcomes, exact = draft.sequence_distribution([0], 2, Sampling(1.0))
    counts = np.zeros(len(exact))
    index = {tuple(o.tolist()): i for i, o in enumerate(outcomes)}
    for seed in range(3000):
        s = _session(target, draft, [0], Sampling(1.0), seed)
        p = _beams(s, 1).propose(s.tokens, (1, 1))
        counts[index[tuple(p.tokens.tolist())]] += 1
    assert np.abs(counts / counts.sum() - exact.numpy()).max() < 0.03


def _top_p_trap():
    """A draft whose top-p 0.5 support after the prompt is {1}, while the raw 2-step joint is won by the
    beam (2, 3): 0.45 * 0.997 against 0.549 * 0.25."""
    tiny = 1e-6
    first = [tiny, 0.549, 0.45, tiny]
    after = {1: [0.25, 0.25, 0.25, 0.25], 2: [tiny, tiny, 0.003, 0.997]}
    table = np.full((3, 4, 4), 0.25)
    table[0, 0] = first
    for token, row in after.items():
        table[1, token] = row
    table /= table.sum(-1, keepdims=True)
    return MarkovLM(table, name="trap")


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("warp", ["joint", "rows"])
def test_beams_never_leave_the_drafts_warped_support(deterministic, warp):
    # ranking by the raw draft kept beam (2, 3), whose warped log q is -inf: the joint test's margin was
    # then +inf and the prefix passed whatever tau was
    draft = _top_p_trap()
    for seed in range(5):
        s = _session(draft, draft, [0], Sampling(1.0, top_p=0.5), seed)
        p = _beams(s, 2, deterministic, "warped", warp).propose(s.tokens, (1, 1))
        assert p.tokens[0] == 1 and torch.isfinite(p.logq).all()


def test_mjsd_under_top_p_applies_the_tau_test():
    # the target's top-p 0.5 support is (2, 3): the raw-ranked beam (2, 3) used to pass with an infinite
    # margin; the draft's warped support starts with 1, which the warped target rules out
    draft = _top_p_trap()
    tiny = 1e-6
    t = np.full((3, 4, 4), 0.25)
    t[0, 0] = [tiny, 0.3, 0.7, tiny]
    t[1, 2] = [tiny, tiny, 0.1, 0.9]
    target = MarkovLM(t / t.sum(-1, keepdims=True), name="target")
    for seed in range(5):
        r = generate(
            target,
            draft,
            [0],
            method="mjsd",
            width=2,
            gamma=2,
            tau=0.5,
            top_p=0.5,
            max_new_tokens=3,
            seed=seed,
            score=False,
        )
        # first block: (1, x) rejected at once, 2 from the target; second: one draft, 3, which both allow
        assert r.token_ids[:2] == [2, 3] and r.stats["target_calls"] == 2 and r.stats["accepted"] == 1


def test_the_joint_warp_is_mtads_eq_2_and_the_row_warp_the_authors_code():
    from multispec.decoding import get_method
    from multispec.verify import beam_distribution

    target, draft = random_markov_pair(6, 8, 2)
    sampling = Sampling(0.8, top_k=3)
    s = _session(target, draft, [0], sampling)
    score = torch.tensor([-0.2, -1.5, -0.9], dtype=torch.float64)
    logits = torch.randn(3, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    joint = _beams(s, 3, warp="joint").extensions(score, logits)
    rows = _beams(s, 3, warp="rows").extensions(score, logits)
    eq2 = beam_distribution(score, torch.log_softmax(logits, -1), sampling)
    assert not joint.log and torch.allclose(joint.weights, eq2)  # top-k 3 over all 18 extensions: 3 survive
    per_row = score[:, None] + torch.log(sampling.probs(logits))
    assert rows.log and torch.allclose(torch.softmax(rows.weights, -1), torch.softmax(per_row.reshape(-1), -1))
    assert int((joint.weights > 0).sum()) == 3 and int(torch.isfinite(rows.weights).sum()) == 9  # 3 per row: 9
    # log q for a warped ratio: the warp's conditional of the token given its beam (the beam distribution
    # renormalised over the beam's extensions), finite where drawable; a beam score adds raw log q
    drawable = (joint.weights > 0).nonzero().flatten()
    beam_scores, steps = joint.at(drawable)
    by_beam = eq2.view(3, 6)
    for flat, beam_score, step in zip(drawable.tolist(), beam_scores, steps, strict=True):
        b, v = divmod(flat, 6)
        assert step == pytest.approx(math.log(by_beam[b, v] / by_beam[b].sum()))
        assert beam_score == pytest.approx(score[b].item() + torch.log_softmax(logits, -1)[b, v].item())
    assert torch.allclose(rows.step, torch.log(sampling.probs(logits)))
    assert get_method("mtad").params["beam_warp"].default == "joint"
    assert get_method("mjsd").params["beam_warp"].default == "rows"


# -- the methods ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["mtad", "mjsd"])
def test_a_draft_identical_to_the_target_passes_every_block(method):
    target, _ = random_markov_pair(4, 40, 7)
    r = generate(target, target, [0], method=method, gamma=4, width=3, tau=0.5, max_new_tokens=30, seed=2)
    assert r.stats["accepted"] == 4 * r.stats["iterations"] and r.stats["target_calls"] == 6  # 6 x (4 + 1)


@pytest.mark.slow
def test_mtad_with_tau_one_is_target_sampling():
    report = check_method("mtad", runs=2500, pairs=2, vocab=3, n_tokens=3, seed=4, tau=1.0, width=3, gamma=2)
    assert report.passed, report.pairs


@pytest.mark.slow
def test_mtad_with_a_small_tau_is_not_target_sampling():
    report = check_method("mtad", runs=2500, pairs=2, vocab=3, n_tokens=3, seed=4, tau=0.05, width=3, gamma=2)
    assert not report.passed  # lossy by design: the checker must say so


def test_theorem_3_6_accepted_length_bound_holds_every_iteration():
    # q = p reweighted by exp(noise) with |noise| <= a: |log q - log p| <= U = 2a at every context
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(4), size=(30, 4))
    q = p * np.exp(rng.uniform(-0.15, 0.15, size=p.shape))
    q /= q.sum(-1, keepdims=True)
    u = float(np.abs(np.log(p) - np.log(q)).max())
    target, draft = MarkovLM(p), MarkovLM(q)
    tau = 0.3
    bound = min(3, math.ceil(abs(math.log(tau)) / u) - 1)
    assert bound >= 2  # the test says something
    for seed in range(20):
        r = generate(
            target, draft, [0], method="mtad", gamma=3, width=4, tau=tau, ratio="raw", max_new_tokens=24, seed=seed
        )
        hist = r.stats["accepted_length_histogram"]
        # every iteration but the last (which the budget may cut) accepted at least `bound`
        assert sum(hist[:bound]) <= 1, hist


@pytest.mark.parametrize(
    "kw",
    [
        {"tau": 0.0},
        {"width": 8, "top_k": 2},
        {"width": 8, "top_p": 0.3},
        {"max_new_tokens": 5, "gamma": 4},
        {"temperature": 0},
    ],
)
@pytest.mark.parametrize("method", ["mtad", "mjsd"])
def test_edge_cases_run_and_respect_the_budget(method, kw):
    target, draft = random_markov_pair(5, 40, 8)
    kw = {"max_new_tokens": 20, **kw}
    r = generate(target, draft, [1], method=method, seed=3, **kw)
    assert len(r.token_ids) == kw["max_new_tokens"] and r.stats["target_calls"] == r.stats["iterations"]


def test_an_eos_inside_an_accepted_block_ends_the_output():
    p = np.full((30, 4, 4), 0.02)
    p[:, :, 3] = 0.94  # token 3 (EOS) is almost certain after anything
    target = MarkovLM(p / p.sum(-1, keepdims=True), eos_token_id=3)
    r = generate(target, target, [0], method="mtad", gamma=4, width=2, tau=0.1, max_new_tokens=20, seed=1)
    assert r.token_ids[-1] == 3 and 3 not in r.token_ids[:-1] and r.stats["stopped"] == "eos"


def test_greedy_mjsd_with_the_target_as_draft_is_greedy_ar_on_a_tiny_llama():
    from tests.conftest import tiny_llama

    model = tiny_llama(seed=9)
    ar = generate(model, None, [4, 8, 15], method="ar", temperature=0, max_new_tokens=24).token_ids
    r = generate(model, model, [4, 8, 15], method="mjsd", temperature=0, gamma=3, width=1, max_new_tokens=24)
    assert r.token_ids == ar and r.stats["rejections"] == 0


# -- mtjd: the exact reference ----------------------------------------------------------------------------------


def _log_likelihood(model: MarkovLM, prompt: list[int], output: list[int]) -> float:
    tokens = prompt + output
    return sum(
        math.log(float(model.conditionals(len(prompt) - 1 + i)[tokens[len(prompt) - 1 + i], tokens[len(prompt) + i]]))
        for i in range(len(output))
    )


def test_greedy_mtjd_emits_the_joint_argmax_of_each_block():
    target, _ = random_markov_pair(4, 20, 11)
    r = generate(target, None, [2], method="mtjd", gamma=3, temperature=0, max_new_tokens=6)
    outcomes, prob = target.sequence_distribution([2], 3, Sampling(1.0))
    assert r.token_ids[:3] == outcomes[int(prob.argmax())].tolist()
    outcomes, prob = target.sequence_distribution([2] + r.token_ids[:3], 3, Sampling(1.0))
    assert r.token_ids[3:] == outcomes[int(prob.argmax())].tolist()
    assert r.stats["iterations"] == 2 and r.stats["target_calls"] == 0


def test_mtjd_with_blocks_of_one_is_greedy_ar():
    target, _ = random_markov_pair(5, 30, 12)
    ar = generate(target, None, [0], method="ar", temperature=0, max_new_tokens=20).token_ids
    assert generate(target, None, [0], method="mtjd", gamma=1, temperature=0, max_new_tokens=20).token_ids == ar


def test_sampled_mtjd_blocks_follow_the_warped_joint():
    target, _ = random_markov_pair(3, 10, 13)
    outcomes, prob = target.sequence_distribution([1], 2, Sampling(1.0))  # the raw joint over 9 blocks
    logits = torch.log(prob)
    expected = Sampling(0.7, top_k=4).probs(logits).numpy()  # the warp acts on the block, not per token
    index = {tuple(o.tolist()): i for i, o in enumerate(outcomes)}
    counts = np.zeros(len(expected))
    for seed in range(3000):
        out = generate(
            target,
            None,
            [1],
            method="mtjd",
            gamma=2,
            temperature=0.7,
            top_k=4,
            max_new_tokens=2,
            seed=seed,
            score=False,
        ).token_ids
        counts[index[tuple(out)]] += 1
    assert (counts[expected == 0] == 0).all()
    assert np.abs(counts / counts.sum() - expected).max() < 0.03


def test_corollary_3_3_greedy_joint_blocks_are_at_least_as_likely_as_greedy_tokens():
    strictly_better = 0
    for seed in range(30):
        target, _ = random_markov_pair(4, 12, 100 + seed, concentration=0.5)
        prompt = [seed % 4]
        joint = generate(target, None, prompt, method="mtjd", gamma=3, temperature=0, max_new_tokens=3).token_ids
        greedy = generate(target, None, prompt, method="ar", temperature=0, max_new_tokens=3).token_ids
        lj, lg = _log_likelihood(target, prompt, joint), _log_likelihood(target, prompt, greedy)
        assert lj >= lg - 1e-12
        strictly_better += lj > lg + 1e-9
    assert strictly_better > 0  # the comparison is not vacuous: greedy misses the best block sometimes


def test_mjsd_with_a_perfect_draft_and_a_wide_beam_is_mtjd_with_a_target_token_after_each_block():
    for seed in range(5):
        target, _ = random_markov_pair(3, 40, 200 + seed, concentration=0.5)
        # W >= V^(gamma - 1) keeps every prefix: the beam is the exact joint argmax; ratio 1 accepts it all
        mjsd = generate(
            target, target, [0], method="mjsd", gamma=3, width=9, ratio="raw", temperature=0, max_new_tokens=24
        ).token_ids
        mtjd = generate(
            target, None, [0], method="mtjd", gamma=3, bonus=True, temperature=0, max_new_tokens=24
        ).token_ids
        assert mjsd == mtjd


def test_mtjd_refuses_real_models_and_blocks_it_cannot_enumerate():
    from tests.conftest import tiny_llama

    with pytest.raises(ValueError, match="only on MarkovLM"):
        generate(tiny_llama(seed=1), None, [1, 2], method="mtjd", max_new_tokens=4)
    big = MarkovLM(np.full((50, 50), 1 / 50))
    with pytest.raises(ValueError, match=r"50\^4 = 6250000 blocks"):
        generate(big, None, [1], method="mtjd", gamma=4, max_new_tokens=4)


def test_mtjd_stays_out_of_the_bench():
    from multispec.tools.bench import default_methods, parse_method_spec

    assert "mtjd" not in default_methods() and {"mtad", "mjsd", "bild"} <= set(default_methods())
    with pytest.raises(ValueError, match="only on MarkovLM"):
        parse_method_spec("mtjd:gamma=2")


# -- bild -------------------------------------------------------------------------------------------------------


def test_rollback_cuts_at_the_first_token_the_target_finds_too_unlikely():
    # -log p of the drafts: 0.69, 2.3, 0.11 -> with tau2 = 1 the second is rolled back, the third never seen
    target = _rows([0.5, 0.5, 0], [0.1, 0.0, 0.9], [0.9, 0.1, 0], [0, 0, 1.0])
    tokens = torch.tensor([0, 0, 0])
    v = rollback_verify(target, tokens, tau2=1.0)
    assert v.accepted == (0,) and v.next_token == 2 and v.rejected  # from row 1, no residual: token 0 allowed
    v = rollback_verify(target, tokens, tau2=2.5)
    assert v.accepted == (0, 1, 2) and v.next_token == 2 and not v.rejected
    # probability 0 is rolled back whatever tau2
    zero = _rows([0.0, 1.0], [0.5, 0.5])
    assert rollback_verify(zero, torch.tensor([0]), tau2=1e9).accepted == ()


def test_the_token_after_a_rollback_follows_the_target_row_including_the_rolled_back_token():
    target = _rows([0.05, 0.35, 0.6], [1.0, 0, 0])
    counts = np.zeros(3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(4000):
        counts[rollback_verify(target, torch.tensor([0]), tau2=1.0, generator=gen).next_token] += 1
    assert np.abs(counts / counts.sum() - [0.05, 0.35, 0.6]).max() < 0.03


def test_greedy_bild_is_greedy_ar():
    for seed in range(4):
        target, draft = random_markov_pair(5, 40, 300 + seed)
        ar = generate(target, None, [1], method="ar", temperature=0, max_new_tokens=30).token_ids
        r = generate(target, draft, [1], method="bild", temperature=0, rollback=3.0, max_new_tokens=30)
        assert r.token_ids == ar and r.stats["target_calls"] == r.stats["iterations"]


def test_bild_hands_over_when_the_draft_is_unsure_and_after_max_unchecked_tokens():
    target, draft = random_markov_pair(4, 60, 14)
    sure = generate(
        target, draft, [0], method="bild", fallback=0.0, max_unchecked=5, rollback=50.0, max_new_tokens=48, seed=1
    ).stats
    # nothing has -log p above 50 here: 8 iterations of 5 drafts and a target token
    assert (sure["iterations"], sure["drafted"], sure["accepted"]) == (8, 40, 40)
    unsure = generate(target, draft, [0], method="bild", fallback=1.0, max_new_tokens=48, seed=1).stats
    # every draft distribution peaks below 1: chains of one (the last step, with room for one token, none)
    assert unsure["iterations"] - 1 <= unsure["drafted"] <= unsure["iterations"] and unsure["iterations"] > 24


def test_bild_is_not_target_sampling():
    report = check_method("bild", runs=2500, pairs=2, vocab=3, n_tokens=3, seed=4, rollback=2.0, fallback=0.5)
    assert not report.passed


# -- perplexity in the stats -------------------------------------------------------------------------------------


def test_generate_reports_the_outputs_perplexity_under_the_unwarped_target():
    target, draft = random_markov_pair(4, 30, 15)
    r = generate(target, draft, [3], method="mtad", top_k=2, max_new_tokens=12, seed=5)
    expected = _log_likelihood(target, [3], r.token_ids) / 12
    assert r.stats["mean_logprob"] == pytest.approx(expected, abs=1e-12)
    assert r.stats["perplexity"] == pytest.approx(math.exp(-expected))
    assert "perplexity" not in generate(target, draft, [3], method="mtad", max_new_tokens=4, score=False).stats
