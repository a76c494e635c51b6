"""Tree verification as pure functions: golden numbers of MCSD §5.5 through the verifiers themselves,
the known-wrong variants of §5.6, and hand-built edge cases."""

import numpy as np
import pytest
import torch

from multispec.drafting import draw_children
from multispec.trees import TokenTree
from multispec.verify import (
    Verdict,
    batch_verify,
    naive_rejection,
    recursive_rejection,
    residual,
    tree_verify,
    without_replacement_rejection,
)
from tests.wrong_rules import dedupe_rejection, sorted_rejection

EX1_TARGET = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
EX1_DRAFT = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
EX2_TARGET = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
EX2_DRAFT = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
TRIALS = 20000


def node_law(rule, target, draft, k, replacement, trials=TRIALS, seed=0):
    """Monte Carlo (acceptance rate, law of the emitted token) of one node rule with k candidates."""
    g = torch.Generator().manual_seed(seed)
    cands, live = draw_children(draft.expand(trials, -1), k, replacement, g)
    accepted, counts = 0, np.zeros(target.shape[0])
    for row, alive in zip(cands, live, strict=True):
        index, token = rule(target, draft, row[alive], g)
        accepted += index is not None
        counts[token] += 1
    return accepted / trials, counts / trials


TOL = 4 * np.sqrt(0.25 / TRIALS)  # four standard errors of a rate


@pytest.mark.parametrize(
    "k, alg1, alg2, naive",
    [(1, 0.6, 0.6, 0.28), (2, 0.76, 0.9, 0.456), (3, 0.828, 1.0, 0.5776), (4, 0.8624, None, 0.6672)],
)
def test_golden_node_acceptance_example_1(k, alg1, alg2, naive):
    rate, law = node_law(recursive_rejection, EX1_TARGET, EX1_DRAFT, k, True)
    assert abs(rate - alg1) < TOL and np.abs(law - EX1_TARGET.numpy()).max() < TOL
    if alg2 is not None:
        rate, law = node_law(without_replacement_rejection, EX1_TARGET, EX1_DRAFT, k, False)
        assert abs(rate - alg2) < TOL and np.abs(law - EX1_TARGET.numpy()).max() < TOL
    rate, law = node_law(naive_rejection, EX1_TARGET, EX1_DRAFT, k, True)
    assert abs(rate - naive) < TOL and np.abs(law - EX1_TARGET.numpy()).max() < TOL


@pytest.mark.parametrize(
    "k, alg1, alg2, naive", [(2, 0.72, 0.764286, 0.35), (3, 0.768, 0.840298, 0.4646), (4, 0.7912, 1.0, 0.5537)]
)
def test_golden_node_acceptance_example_2(k, alg1, alg2, naive):
    assert abs(node_law(recursive_rejection, EX2_TARGET, EX2_DRAFT, k, True, 10000)[0] - alg1) < 2 * TOL
    assert abs(node_law(without_replacement_rejection, EX2_TARGET, EX2_DRAFT, k, False, 10000)[0] - alg2) < 2 * TOL
    assert abs(node_law(naive_rejection, EX2_TARGET, EX2_DRAFT, k, True, 10000)[0] - naive) < 2 * TOL


def tree_block_efficiency(branching, rule, replacement, trials=20000, seed=0):
    """Mean tokens per iteration of `tree_verify` on a full tree with context-free rows (Example 1)."""
    g = torch.Generator().manual_seed(seed)
    tree = TokenTree.from_branching(branching)
    target = EX1_TARGET.expand(1 + tree.size, -1)
    draft = EX1_DRAFT.expand(1 + tree.size, -1)
    total = 0
    for _ in range(trials):
        parts, lives = [], []
        width = 1
        for k in branching:
            t, alive = draw_children(EX1_DRAFT.expand(width, -1), k, replacement, g)
            parts.append(t.reshape(-1))
            lives.append(alive.reshape(-1))
            width *= k
        tokens, live = torch.cat(parts), torch.cat(lives)
        verdict = tree_verify(tree, tokens, target, draft, g, rule, live=None if live.all() else live)
        total += len(verdict.new_tokens)
    return total / trials


@pytest.mark.parametrize(
    "branching, replacement, expected",
    [((1, 1), True, 1.96), ((2, 1), True, 2.216), ((2, 1), False, 2.44), ((4, 2, 2, 1, 1), True, 3.4941)],
)
def test_golden_tree_block_efficiency(branching, replacement, expected):
    rule = recursive_rejection if replacement else without_replacement_rejection
    trials = 6000 if len(branching) > 2 else 12000
    tau = tree_block_efficiency(branching, rule, replacement, trials)
    assert abs(tau - expected) < 0.035, tau


# -- known-wrong variants (MCSD §5.6 item 10): each must give the wrong law --------------------------


@pytest.mark.parametrize(
    "rule, k, replacement, wrong_law",
    [
        (dedupe_rejection, 3, True, [0.436, 0.364, 0.2]),
        (sorted_rejection, 2, False, [0.5, 0.2, 0.3]),
        (recursive_rejection, 2, False, [0.4, 0.4, 0.2]),  # drawn without replacement, verified as i.i.d.
    ],
)
def test_known_wrong_variants_have_the_wrong_law(rule, k, replacement, wrong_law):
    _, law = node_law(rule, EX1_TARGET, EX1_DRAFT, k, replacement)
    assert np.abs(law - np.array(wrong_law)).max() < TOL
    assert np.abs(law - EX1_TARGET.numpy()).max() > 0.05


@pytest.mark.parametrize("seed", range(6))
def test_alg2_accepts_at_least_as_often_as_alg1_and_both_beat_naive(seed):
    rng = np.random.default_rng(seed)
    target = torch.tensor(rng.dirichlet(np.ones(5)))
    draft = torch.tensor(rng.dirichlet(np.ones(5)))
    a1 = node_law(recursive_rejection, target, draft, 3, True, 12000, seed)[0]
    a2 = node_law(without_replacement_rejection, target, draft, 3, False, 12000, seed)[0]
    an = node_law(naive_rejection, target, draft, 3, True, 12000, seed)[0]
    assert a2 >= a1 - 0.02 and a1 >= an - 0.02


def test_full_support_without_replacement_always_accepts():
    # MCSD §5.6 item 7: k >= |supp(draft)| and supp(target) within it
    rate, _ = node_law(without_replacement_rejection, EX1_TARGET, EX1_DRAFT, 3, False, 5000)
    assert rate == 1.0


# -- hand-built edge cases --------------------------------------------------------------------------

EYE = torch.eye(6, dtype=torch.float64)


def test_all_accepted_takes_the_bonus_from_the_leaf_row():
    tree = TokenTree.from_branching([2, 1])  # nodes 0, 1 at depth 1; 2 (child of 0), 3 (child of 1)
    tokens = torch.tensor([4, 1, 2, 5])
    target = EYE[[1, 3, 5, 0, 4]]  # root -> 1 (node 1), node 1 -> 5 (node 3), node 3 -> bonus 4
    draft = torch.full((5, 6), 1 / 6, dtype=torch.float64)
    v = tree_verify(tree, tokens, target, draft)
    assert v == Verdict((1, 3), (1, 5), 4, False)
    assert v.new_tokens == [1, 5, 4]


def test_first_depth_rejected_emits_the_residual_token():
    tree = TokenTree.from_branching([2, 2])
    tokens = torch.tensor([0, 1, 2, 3, 4, 5])
    target = EYE[[3] * 7]  # the target always wants 3; neither root child is 3
    draft = torch.full((3, 6), 1 / 6, dtype=torch.float64)
    for rule in (recursive_rejection, without_replacement_rejection, naive_rejection):
        v = tree_verify(tree, tokens, target, draft, rule=rule)
        assert v == Verdict((), (), 3, True)


def test_one_hot_draft_rows_reduce_to_exact_match():
    tree = TokenTree.from_branching([3])
    tokens = torch.tensor([2, 4, 5])
    draft = torch.zeros(1, 6, dtype=torch.float64)
    draft[0, [2, 4, 5]] = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    target = EYE[[4, 1, 0, 3]]  # wants 4 at the root; bonus after node 1 is 0
    v = tree_verify(tree, tokens, target, draft, rule=without_replacement_rejection)
    assert v == Verdict((1,), (4,), 0, False)


def test_empty_tree_is_a_plain_target_step():
    v = tree_verify(
        TokenTree.from_parents([]), torch.empty(0, dtype=torch.long), EYE[[2]], torch.empty(0, 6, dtype=torch.float64)
    )
    assert v == Verdict((), (), 2, False)


def test_dead_padding_candidates_are_never_accepted():
    tree = TokenTree.from_branching([3])
    tokens = torch.tensor([4, 2, 2])  # slots 1 and 2 are padding; as live candidates, 2 would pass
    live = torch.tensor([True, False, False])
    target = EYE[[2, 0, 0, 0]]  # the target wants 2
    draft = 0.5 * (EYE[[4]] + EYE[[2]])
    v = tree_verify(tree, tokens, target, draft, rule=recursive_rejection, live=live)
    assert v == Verdict((), (), 2, True)  # 4 rejected, the padding skipped, 2 drawn from the residual
    assert tree_verify(tree, tokens, target, draft, rule=recursive_rejection).accepted == (1,)


def test_no_bonus_leaves_the_next_token_empty():
    tree = TokenTree.from_branching([1, 1])
    tokens = torch.tensor([1, 2])
    v = tree_verify(tree, tokens, EYE[[1, 2]], EYE[[1, 2]], bonus=False)
    assert v == Verdict((0, 1), (1, 2), None, False)


def test_batch_verify_is_the_tree_rule_on_chains():
    # two chains of two drafts; chain 1 is the target's greedy path
    target = torch.stack([EYE[[3, 2, 0]], EYE[[3, 2, 0]]])  # [M, g + 1, V]: root wants 3, then 2, bonus 0
    draft = torch.stack([EYE[[1, 5]], EYE[[3, 2]]])
    tokens = torch.tensor([[1, 5], [3, 2]])
    v = batch_verify(target, draft, tokens)
    assert v.accepted == (1, 3) and v.new_tokens == [3, 2, 0]  # node (d, m) = (d - 1) * M + m


def test_recursive_rejection_tries_every_duplicate():
    # the second copy of a rejected token is rejected too, and the residual keeps moving
    target, draft = EX1_TARGET, EX1_DRAFT
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        index, token = recursive_rejection(target, draft, torch.tensor([2, 2]), g)
        assert index in (None, 0)  # 2 has target < draft: once rejected, a repeat cannot pass
        if index is None:
            assert token in (0, 1)
    twice = torch.tensor([0.55 / 0.6, 0.05 / 0.6, 0], dtype=torch.float64)  # norm(max(0, [.75, .25, 0] - draft))
    assert torch.allclose(residual(residual(target, draft), draft), twice)


def test_greedy_tree_verify_is_the_tree_walk_on_one_hot_target_rows():
    # random irregular trees, candidates, dead padding and fixed (copied) children, one-hot target rows:
    # the same verdict as tree_verify with each exact node rule; a variant that accepts each node's first
    # child without testing the target's token differs
    from multispec.verify import (
        Verdict,
        greedy_tree_verify,
        naive_rejection,
        recursive_rejection,
        tree_verify,
        without_replacement_rejection,
    )

    rng = torch.Generator().manual_seed(5)
    vocab = 4
    eye = torch.eye(vocab, dtype=torch.float64)

    def first_child_always(tree, tokens, target_tokens, bonus, live, fixed):
        node, accepted = -1, []
        while tree.children(node):
            node = tree.children(node)[0]
            accepted.append(node)
        return Verdict(
            tuple(accepted),
            tuple(int(tokens[a]) for a in accepted),
            int(target_tokens[1 + node]) if bonus else None,
            False,
        )

    mismatches = {"greedy": 0, "wrong": 0}
    for case in range(300):
        n = int(torch.randint(1, 8, (1,), generator=rng))
        parents = [int(torch.randint(-1, g, (1,), generator=rng)) if g else -1 for g in range(n)]
        tree = TokenTree.canonical(parents)
        tokens = torch.randint(vocab, (n,), generator=rng)
        targets = torch.randint(vocab, (1 + n,), generator=rng)
        live = torch.rand(n, generator=rng) > 0.2 if case % 3 == 0 else None
        fixed = torch.rand(n, generator=rng) > 0.6 if case % 4 == 0 else None
        draft = torch.softmax(torch.randn(1 + n, vocab, generator=rng, dtype=torch.float64), -1)
        for rule in (recursive_rejection, without_replacement_rejection, naive_rejection):
            if rule is without_replacement_rejection:  # its candidates must be distinct per parent
                if any(
                    len(set(tokens[list(tree.children(g))].tolist())) != len(tree.children(g)) for g in range(-1, n)
                ):
                    continue
            for bonus in (True, False):
                want = tree_verify(
                    tree, tokens, eye[targets], draft, torch.Generator().manual_seed(case), rule, bonus, live, fixed
                )
                got = greedy_tree_verify(tree, tokens, targets, bonus, live, fixed)
                mismatches["greedy"] += got != want
                mismatches["wrong"] += first_child_always(tree, tokens, targets, bonus, live, fixed) != want
    assert mismatches["greedy"] == 0 and mismatches["wrong"] > 0, mismatches
