"""Layer-by-layer beam verification and the dynamic width (DSBD): hand-built cases, the exact law of
one layer's outputs, the acceptance-count recursion against enumeration, and the traps of spec §4.4."""

import itertools

import numpy as np
import pytest
import torch

from multispec.verify import acceptance_count_law, beam_distribution, beam_layer_verify, dynamic_width
from multispec.warp import Sampling
from tests.wrong_rules import dropping_beam_layer_verify


def _dist(*values):
    t = torch.tensor(values, dtype=torch.float64)
    return t / t.sum()


def test_beam_distribution_warps_the_joint_over_all_parents_and_tokens():
    scores = torch.log(torch.tensor([0.5, 0.25], dtype=torch.float64))
    logprobs = torch.log(torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.2, 0.6]], dtype=torch.float64))
    joint = np.array([0.25, 0.25, 0.0, 0.05, 0.05, 0.15])
    assert np.allclose(beam_distribution(scores, logprobs, Sampling(1.0)).numpy(), joint / joint.sum())
    top2 = beam_distribution(scores, logprobs, Sampling(1.0, top_k=2)).numpy()
    assert np.allclose(top2, [0.5, 0.5, 0, 0, 0, 0])  # top-k over the 6 candidates, not per parent
    dead = beam_distribution(scores, logprobs, Sampling(1.0), live=torch.tensor([False, True])).numpy()
    assert np.allclose(dead, [0, 0, 0, 0.2, 0.2, 0.6])


def test_a_draft_equal_to_its_target_candidate_distribution_is_always_accepted():
    beam = _dist(1, 2, 3, 4)
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        drafts = torch.multinomial(beam.float(), 3, replacement=True, generator=gen)
        v = beam_layer_verify(beam, beam, drafts, torch.ones(3, dtype=torch.bool), 3, 4, gen)
        assert v.accepted == (0, 1, 2) and not v.rejected and v.next_token is None


def test_a_draft_of_a_dead_parent_is_rejected_and_the_layer_fills_its_width():
    target = _dist(0, 0, 1, 1)  # candidates 0, 1 belong to a rejected parent
    draft = _dist(1, 1, 1, 1)
    v = beam_layer_verify(target, draft, torch.tensor([0, 1, 0]), torch.tensor([False, False, False]), 2, 4)
    assert v.accepted == () and v.rejected and v.drawn == 0 and v.next_token in (2, 3)
    assert len(v.beams) == 2 and {b.token for b in v.beams} <= {2, 3} and {b.parent for b in v.beams} == {0}


def _outputs(v, vocab):
    return [b.parent * vocab + b.token for b in v.beams]


def _layer_law(rule, target, draft, parent_of, live_parents, m, width, runs, seed=0):
    """Empirical law of the layer's `width` outputs (accepted, then residual and fills), as an ordered tuple:
    [N] for one output, [N, N] for two."""
    n = target.numel()
    counts = np.zeros((n,) * width)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(runs):
        drafts = torch.multinomial(draft.float(), m, replacement=True, generator=gen)
        live = live_parents[parent_of[drafts]]
        out = _outputs(rule(target, draft, drafts, live, width, n, gen), n)
        counts[tuple(out[:width])] += 1
    return counts / runs


def _setup():
    # 3 parents x 3 tokens; parent 2 was rejected at the previous layer: the target gives it nothing, the
    # draft (which drew from all parents) does
    rng = np.random.default_rng(3)
    draft = rng.dirichlet(np.ones(9))
    draft[6:] *= 3  # the dead parent holds much of the draft's mass
    draft = torch.tensor(draft / draft.sum(), dtype=torch.float64)
    target = torch.tensor(np.r_[rng.dirichlet(np.ones(6)), np.zeros(3)], dtype=torch.float64)
    parent_of = torch.arange(9) // 3
    live_parents = torch.tensor([True, True, False])
    return target, draft, parent_of, live_parents


def test_one_layers_outputs_are_independent_draws_from_the_target_beam_distribution():
    target, draft, parent_of, live_parents = _setup()
    law = _layer_law(beam_layer_verify, target, draft, parent_of, live_parents, m=3, width=2, runs=30000)
    exact = np.outer(target.numpy(), target.numpy())
    assert 0.5 * np.abs(law - exact).sum() < 0.025


def test_dropping_the_drafts_of_dead_parents_without_renormalising_is_biased():
    target, draft, parent_of, live_parents = _setup()
    law = _layer_law(dropping_beam_layer_verify, target, draft, parent_of, live_parents, m=3, width=2, runs=30000)
    exact = np.outer(target.numpy(), target.numpy())
    assert 0.5 * np.abs(law - exact).sum() > 0.06


def _without_replacement(rule):
    """Wrong drafting (spec §4.4 item 4): the m drafts drawn without replacement (here: distinct candidates)."""

    def verify(target, draft, drafts, live, width, vocab, gen):
        distinct = torch.multinomial(draft.float(), drafts.numel(), replacement=False, generator=gen)
        return rule(target, draft, distinct, torch.ones_like(live), width, vocab, gen)

    return verify


def _sorted(rule):
    """Wrong drafting: the i.i.d. drafts re-sorted by their draft probability, best first."""

    def verify(target, draft, drafts, live, width, vocab, gen):
        order = torch.argsort(draft[drafts], descending=True, stable=True)
        return rule(target, draft, drafts[order], live[order], width, vocab, gen)

    return verify


@pytest.mark.parametrize("wrong", [_without_replacement, _sorted])
def test_drafts_drawn_without_replacement_or_sorted_are_biased(wrong):
    rng = np.random.default_rng(2)
    target = torch.tensor(rng.dirichlet(np.ones(4)), dtype=torch.float64)
    draft = torch.tensor(rng.dirichlet(np.ones(4)), dtype=torch.float64)
    parent_of, live = torch.zeros(4, dtype=torch.long), torch.tensor([True])
    exact = target.numpy()
    right = _layer_law(beam_layer_verify, target, draft, parent_of, live, m=3, width=1, runs=10000)
    bad = _layer_law(wrong(beam_layer_verify), target, draft, parent_of, live, m=3, width=1, runs=10000)
    assert 0.5 * np.abs(right - exact).sum() < 0.02
    assert 0.5 * np.abs(bad - exact).sum() > 0.07


def _enumerated_count_law(target, draft, m):
    """P(k of m accepted), by enumerating every draw of m candidates and every accept/reject outcome."""
    from multispec.verify import residual

    law = np.zeros(m + 1)
    n = target.numel()
    for drafts in itertools.product(range(n), repeat=m):
        weight = float(np.prod([draft[x] for x in drafts]))
        # branches: (probability, running distribution, acceptances)
        branches = [(weight, target, 0)]
        for x in drafts:
            nxt = []
            for prob, running, k in branches:
                a = min(1.0, float(running[x] / draft[x]))
                if a > 0:
                    nxt.append((prob * a, target, k + 1))
                if a < 1:
                    nxt.append((prob * (1 - a), residual(running, draft), k))
            branches = nxt
        for prob, _, k in branches:
            law[k] += prob
    return law


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_acceptance_count_recursion_equals_enumeration(seed):
    rng = np.random.default_rng(seed)
    target = torch.tensor(np.r_[rng.dirichlet(np.ones(4)), 0.0], dtype=torch.float64)  # one dead candidate
    draft = torch.tensor(rng.dirichlet(np.ones(5)), dtype=torch.float64)
    for m in (1, 2, 4):
        assert np.allclose(
            acceptance_count_law(target, draft, m).numpy(), _enumerated_count_law(target, draft, m), atol=1e-12
        )


def test_the_count_law_is_what_verification_does():
    rng = np.random.default_rng(7)
    target = torch.tensor(rng.dirichlet(np.ones(6)), dtype=torch.float64)
    draft = torch.tensor(rng.dirichlet(np.ones(6)), dtype=torch.float64)
    counts = np.zeros(5)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20000):
        drafts = torch.multinomial(draft.float(), 4, replacement=True, generator=gen)
        counts[len(beam_layer_verify(target, draft, drafts, torch.ones(4, dtype=torch.bool), 4, 6, gen).accepted)] += 1
    assert np.abs(counts / counts.sum() - acceptance_count_law(target, draft, 4).numpy()).max() < 0.015


def test_dynamic_width_identities():
    rng = np.random.default_rng(11)
    for _ in range(20):
        target = torch.tensor(rng.dirichlet(np.ones(6)), dtype=torch.float64)
        draft = torch.tensor(rng.dirichlet(np.ones(6)), dtype=torch.float64)
        law = acceptance_count_law(target, draft, 5)
        assert law.sum().item() == pytest.approx(1.0) and (law >= -1e-15).all()
        widths = [dynamic_width(target, draft, 5, t, 1) for t in (0.0, 0.2, 0.5, 0.8, 1.0)]
        assert widths[0] == 5 and widths == sorted(widths, reverse=True) and all(1 <= w <= 5 for w in widths)
        assert dynamic_width(target, draft, 5, 1.5, 2) == 2  # threshold above 1: the floor
    same = _dist(1, 2, 3)
    assert acceptance_count_law(same, same, 3).tolist() == pytest.approx([0, 0, 0, 1])
    assert dynamic_width(same, same, 3, 1.0, 1) == 3
