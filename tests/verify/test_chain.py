"""The chain verifier as a pure function: exact law by enumeration, golden numbers, a broken variant."""

from functools import partial

import numpy as np
import pytest
import torch

from multispec.verify import relaxed_verify, residual, speculative_verify
from multispec.warp import LazyRows
from tests.wrong_rules import no_residual_verify

EX1_TARGET = [0.5, 0.3, 0.2]
EX1_DRAFT = [0.2, 0.2, 0.6]


def exact_one_step_law(target, draft):
    """Law of the emitted token for one draft position (g = 1), computed from the rule's definition."""
    target, draft = torch.as_tensor(target, dtype=torch.float64), torch.as_tensor(draft, dtype=torch.float64)
    accept = torch.minimum(target, draft)  # P(draft = x and accepted)
    reject_mass = 1 - accept.sum()
    return accept + reject_mass * residual(target, draft)


def test_residual_guard_and_values():
    r = residual(torch.tensor(EX1_TARGET, dtype=torch.float64), torch.tensor(EX1_DRAFT, dtype=torch.float64))
    assert torch.allclose(r, torch.tensor([0.75, 0.25, 0.0], dtype=torch.float64))
    same = torch.tensor([0.2, 0.8], dtype=torch.float64)
    assert torch.equal(residual(same, same), same)  # zero mass: falls back to the target row


@pytest.mark.parametrize("seed", range(20))
def test_one_step_law_equals_target_exactly(seed):
    rng = np.random.default_rng(seed)
    v = int(rng.integers(2, 7))
    target, draft = rng.dirichlet(np.ones(v)), rng.dirichlet(np.ones(v) * 0.5)
    target[rng.integers(v)] = 0  # zeros on either side must be handled
    target /= target.sum()
    law = exact_one_step_law(target, draft)
    assert torch.allclose(law, torch.tensor(target), atol=1e-12)


def _verify_law_by_enumeration(target_rows, draft_rows, verify, trials=20000, seed=0):
    """Monte Carlo law of (accepted count, emitted tokens) for a 2-draft chain with fixed rows."""
    g = torch.Generator().manual_seed(seed)
    target = torch.tensor(target_rows, dtype=torch.float64)
    draft = torch.tensor(draft_rows, dtype=torch.float64)
    v = target.shape[1]
    counts = {}
    for _ in range(trials):
        tokens = torch.multinomial(draft, 1, generator=g)[:, 0]
        first = verify(target, draft, tokens, g).new_tokens[0]
        counts[first] = counts.get(first, 0) + 1
    return np.array([counts.get(x, 0) for x in range(v)]) / trials


def test_monte_carlo_first_token_law_and_acceptance():
    rows_t = [EX1_TARGET, EX1_TARGET, EX1_TARGET]
    rows_d = [EX1_DRAFT, EX1_DRAFT]
    law = _verify_law_by_enumeration(rows_t, rows_d, speculative_verify)
    assert np.abs(law - np.array(EX1_TARGET)).max() < 0.01
    g = torch.Generator().manual_seed(1)
    target = torch.tensor(rows_t, dtype=torch.float64)
    draft = torch.tensor(rows_d, dtype=torch.float64)
    accepted = []
    for _ in range(10000):
        tokens = torch.multinomial(draft, 1, generator=g)[:, 0]
        accepted.append(len(speculative_verify(target, draft, tokens, g).accepted))
    # context-free rows: block efficiency for gamma 2 is 1 + a + a^2 = 1.96 (specs/MCSD §5.5)
    assert abs(1 + np.mean(accepted) - 1.96) < 4 * np.std(accepted) / np.sqrt(len(accepted))


def test_broken_variant_has_the_wrong_law():
    law = _verify_law_by_enumeration([EX1_TARGET] * 3, [EX1_DRAFT] * 2, no_residual_verify)
    # exact law of the broken rule: min(t, d) + 0.4 * t = [0.4, 0.32, 0.28]
    assert np.abs(law - np.array([0.4, 0.32, 0.28])).max() < 0.01
    assert np.abs(law - np.array(EX1_TARGET)).max() > 0.05


def test_greedy_rows_accept_iff_draft_is_target_argmax():
    eye = torch.eye(4, dtype=torch.float64)
    target = eye[[1, 2, 3]]  # argmax 1, 2, then bonus 3
    for drafts, expect in [([1, 2], (2, 3)), ([1, 0], (1, 2)), ([0, 2], (0, 1))]:
        tokens = torch.tensor(drafts)
        v = speculative_verify(target, eye[tokens], tokens)
        assert (len(v.accepted), v.next_token) == expect
        assert v.new_tokens == drafts[: expect[0]] + [expect[1]]


def test_greedy_verify_is_the_chain_rule_on_one_hot_target_rows():
    # every case of up to 3 drafts over 3 tokens, draft rows one-hot or not: the same verdict as the rule;
    # a variant that stops at the first draft the draft itself doubted (not the target) differs
    import itertools

    from multispec.verify import Verdict, greedy_verify

    eye = torch.eye(3, dtype=torch.float64)
    soft = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)

    def mismatches(rule) -> int:
        count = 0
        for g in (1, 2, 3):
            for drafts in itertools.product(range(3), repeat=g):
                for targets in itertools.product(range(3), repeat=g + 1):
                    for bonus in (True, False):
                        tokens, rows = torch.tensor(drafts), eye[list(targets)]
                        draft_rows = soft.expand(g, -1) if sum(drafts) % 2 else eye[tokens]
                        want = speculative_verify(
                            rows if bonus else rows[:-1],
                            draft_rows,
                            tokens,
                            torch.Generator().manual_seed(0),
                            bonus=bonus,
                        )
                        count += rule(torch.tensor(targets if bonus else targets[:-1]), tokens, bonus) != want
        return count

    def accepts_every_draft(target_tokens, draft_tokens, bonus):
        g = draft_tokens.shape[0]
        return Verdict(tuple(range(g)), tuple(draft_tokens.tolist()), int(target_tokens[g]) if bonus else None)

    assert mismatches(lambda t, d, bonus: greedy_verify(t, d, bonus=bonus)) == 0
    assert mismatches(accepts_every_draft) > 0


def _counting_rows(rows: torch.Tensor, made: list[int]) -> LazyRows:
    def make(i):
        made.append(i)
        return rows[i].clone()

    return LazyRows(rows.shape[0], make)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "rule", [speculative_verify, partial(relaxed_verify, eps=0.05), partial(relaxed_verify, eps=0.05, resample="uno")]
)
def test_rows_made_on_use_give_the_same_verdicts_and_skip_rows_after_a_rejection(rule, dtype):
    rng = np.random.default_rng(3)
    skipped = 0
    for trial in range(200):
        g, v = int(rng.integers(1, 5)), 6
        target = torch.tensor(rng.dirichlet(np.ones(v), g + 1), dtype=dtype)
        draft = torch.tensor(rng.dirichlet(np.ones(v) * 0.5, g), dtype=dtype)
        tokens = torch.multinomial(draft, 1, generator=torch.Generator().manual_seed(trial))[:, 0]
        bonus = bool(trial % 3)
        target = target if bonus else target[:-1]
        want = rule(target, draft, tokens, torch.Generator().manual_seed(trial), bonus=bonus)
        made_target, made_draft = [], []
        got = rule(
            _counting_rows(target, made_target),
            _counting_rows(draft, made_draft),
            tokens,
            torch.Generator().manual_seed(trial),
            bonus=bonus,
        )
        assert got == want
        n = len(want.accepted)
        assert max(made_target) == min(n, target.shape[0] - 1)  # rows after the first rejection never made
        assert max(made_draft) <= n
        skipped += target.shape[0] - len(set(made_target))
    assert skipped > 50
