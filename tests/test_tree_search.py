"""Arbitrary trees (`tree=FILE`), acceptance by sibling rank, the optimal-tree programme, `tree=auto`, and
`multispec tune` with its plan files."""

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import multispec.decoding.tree
from multispec.api import generate
from multispec.models.cost import ForwardCost
from multispec.models.markov import random_markov_pair
from multispec.tools.check import check_method
from multispec.tree_search import (
    MAX_CHILDREN,
    RankAcceptance,
    TreeTable,
    fastest_tree,
    iteration_seconds,
    reach_of,
    record_verdict,
    search_tree,
    tree_value,
    value_bound,
)
from multispec.trees import TokenTree, load_tree, tree_from_json
from multispec.verify import recursive_rejection

IRREGULAR = [-1, -1, 0, 0, 2, -1]  # three children of the root; the first has two, its first has one


# -- trees ------------------------------------------------------------------------------------------


def test_a_tree_is_read_from_parents_or_nested_lists_and_laid_out_breadth_first(tmp_path):
    nested = tree_from_json([[[], []], []])
    assert nested.parents.tolist() == [-1, -1, 0, 0]
    # node 1 is a child of node 0 in the file but comes before node 2, a child of the root
    relaid = tree_from_json([-1, 0, -1, 1, 0])
    assert relaid.parents.tolist() == [-1, -1, 0, 0, 2]
    assert relaid.widths() == [2, 2, 1] and relaid.branching() == (2, 2, 1)
    assert relaid.truncate(2).parents.tolist() == [-1, -1, 0, 0]
    path = tmp_path / "tree.json"
    path.write_text(json.dumps({"parents": IRREGULAR}))
    assert load_tree(path).parents.tolist() == [-1, -1, -1, 0, 0, 3]


def test_a_drafted_level_keeps_each_nodes_own_number_of_draws():
    # parents [-1, -1, -1, 0, 0, 3]: the root draws 3; at depth 2 nodes 0, 1, 2 have 2, 0, 0 children, so of the
    # 3 x 2 grid of draws the level keeps cells 0 and 1; at depth 3 node 3 has 1 child and node 4 none
    tree = tree_from_json(IRREGULAR)
    assert tree.draws(1, "cpu") == (3, None)
    k, index = tree.draws(2, "cpu")
    assert k == 2 and index.tolist() == [0, 1]
    k, index = tree.draws(3, "cpu")
    assert k == 1 and index.tolist() == [0]
    even = TokenTree.from_branching((2, 2, 1))
    assert [even.draws(d, "cpu") for d in (1, 2, 3)] == [(2, None), (2, None), (1, None)]


@pytest.mark.parametrize(
    "content, message",
    [
        ("[0]", "parents must come before their children"),
        ("[-1, 2, 0]", "parents must come before their children"),
        ("[]", "non-empty list"),
        ("[-1, true]", "integers only"),
        ("[[], 3]", "integers only"),
        ('{"kids": [-1]}', "'parents' list"),
        ("-1, 0", "not JSON"),
    ],
)
def test_a_bad_tree_file_is_refused_with_the_reason(tmp_path, content, message):
    path = tmp_path / "tree.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_tree(path)
    with pytest.raises(ValueError, match=message):  # through the method's parameter check
        generate(*random_markov_pair(4, 6, 0), [1], method="mcsd", tree=str(path), max_new_tokens=2)


def test_a_missing_tree_file_is_named():
    with pytest.raises(ValueError, match="cannot read the tree file 'no/such.json'"):
        generate(*random_markov_pair(4, 6, 0), [1], method="mcsd", tree="no/such.json", max_new_tokens=2)


# -- acceptance by sibling rank -----------------------------------------------------------------


def _counts(ranks, key="model"):
    return ranks[key].tries.tolist(), ranks[key].accepts.tolist()


def test_rank_acceptance_counts_the_children_tried_in_draw_order():
    tree = TokenTree.from_branching([2, 2])  # 0, 1 at depth 1; 2, 3 under 0; 4, 5 under 1
    ranks = {}
    record_verdict(ranks, "model", tree, (1, 4), rejected=False)  # rank 0 rejected, rank 1 accepted; then rank 0
    assert _counts(ranks) == ([[1, 1], [1, 0]], [[0, 1], [1, 0]])
    ranks = {}
    record_verdict(ranks, "model", tree, (0,), rejected=True)  # both children of node 0 tried and rejected
    assert _counts(ranks) == ([[1, 0], [1, 1]], [[1, 0], [0, 0]])
    ranks = {}
    record_verdict(ranks, "model", tree, (), rejected=True, live=torch.tensor([True, False, True, True, True, True]))
    assert _counts(ranks) == ([[1]], [[0]])  # padding is never tried


def test_copied_children_are_tried_first_and_counted_apart():
    tree = TokenTree.from_parents([-1, -1, -1])  # nodes 0, 1 drawn by the model, node 2 copied
    fixed = torch.tensor([False, False, True])
    ranks = {}
    record_verdict(ranks, "model", tree, (1,), rejected=False, fixed=fixed)
    assert _counts(ranks, "copy") == ([[1]], [[0]]) and _counts(ranks) == ([[1, 1]], [[0, 1]])
    ranks = {}
    record_verdict(ranks, "model", tree, (2,), rejected=False, fixed=fixed)
    assert _counts(ranks, "copy") == ([[1]], [[1]]) and "model" not in ranks


def test_tree_methods_report_rank_acceptance_in_stats():
    target, draft = random_markov_pair(6, 30, 3)
    stats = generate(target, draft, [1], method="mcsd", k_config="3x2", max_new_tokens=20, seed=0).stats
    counts = stats["rank_acceptance"]["model/without-replacement"]
    tries, accepts = np.array(counts["tries"]), np.array(counts["accepts"])
    # every iteration that drafted (all but a last plain step where one token of room is left) tries the
    # first child of the root; later ranks only after rejections
    drafted = sum(stats["accepted_length_histogram"])
    assert stats["iterations"] - 1 <= drafted <= stats["iterations"]
    assert tries.shape[1] == 3 and (accepts <= tries).all() and tries[0, 0] == drafted
    assert (tries[:, 1:] <= tries[:, :-1]).all()
    greedy = generate(target, draft, [1], method="mcsd", k_config="3x2", max_new_tokens=20, temperature=0).stats
    iid = generate(target, draft, [1], method="mcsd", k_config="3x2", replacement=True, max_new_tokens=20).stats
    assert set(greedy["rank_acceptance"]) == {"model/top-k"} and set(iid["rank_acceptance"]) == {"model/iid"}


# -- the optimal tree -----------------------------------------------------------------------------


def _every_tree(n: int, depth: int, ranks: int):
    seen = set()
    for parents in itertools.product(*[range(-1, g) for g in range(n)]):
        tree = TokenTree.canonical(list(parents))
        key = tuple(tree.parents.tolist())
        if key not in seen and tree.max_depth <= depth and all(len(tree.children(g)) <= ranks for g in range(-1, n)):
            seen.add(key)
            yield tree


def test_the_programme_finds_the_best_tree_of_every_size_by_exhaustion():
    rng = np.random.default_rng(0)
    for _ in range(2):
        reach = reach_of(rng.uniform(0.05, 0.9, size=(3, 3)))
        table = TreeTable(reach, 5, 3)
        for depth in (1, 2, 3):
            for n in range(1, 6):
                best = max((tree_value(t, reach) for t in _every_tree(n, depth, 3)), default=-np.inf)
                assert table.value(n, depth) == pytest.approx(best)
                if np.isfinite(best):
                    found = table.tree(n, depth)
                    assert found.size == n and found.max_depth <= depth
                    assert tree_value(found, reach) == pytest.approx(best)


def test_optimal_trees_beat_k_configs_of_the_same_size():
    reach = reach_of(np.tile([0.6, 0.3, 0.2, 0.15, 0.1, 0.1, 0.1, 0.1], (8, 1)))
    table = TreeTable(reach, 64, 8)
    for k in ("2x1x1", "4x2x1", "8x2", "4x2x2", "8x2x1x1"):
        tree = TokenTree.from_branching([int(x) for x in k.split("x")])
        assert table.value(tree.size, 8) >= tree_value(tree, reach) - 1e-12
    big = TokenTree.from_branching([4, 2, 2])
    assert table.value(big.size, 8) > tree_value(big, reach) + 0.1


def test_the_fastest_tree_follows_the_cost_curve():
    reach = reach_of(np.tile([0.8, 0.4, 0.3, 0.2], (10, 1)))
    table = TreeTable(reach, 32, 10)
    flat = fastest_tree(table, ForwardCost(tuple([1.0] * 33)), None, 100)
    steep = fastest_tree(table, ForwardCost(tuple(1.0 + k for k in range(33))), None, 100)
    assert flat.nodes == 32 and flat.tokens == pytest.approx(table.values[:, 32].max())
    assert steep.nodes < 8
    useless = fastest_tree(TreeTable(reach_of(np.zeros((4, 4))), 8, 4), ForwardCost((1.0, 1.2)), None, 100)
    assert useless.nodes == 0  # drafting cannot pay: a plain step


def _every_choice(
    table,
    target_cost,
    draft_cost,
    context,
    overhead,
    per_node,
    chain_cost=None,
    chain_draft=None,
    chain_work=None,
    switch=0.0,
):
    """Tokens per second of every (size, depth limit) the table holds, priced as `iteration_seconds` does: a
    chain on `chain_cost` and `chain_draft`, with work `chain_work` (per iteration, per node), where given; each
    drafted iteration's token pays `switch` seconds more."""
    for depth in range(1, table.max_depth + 1):
        for n in range(1, table.max_nodes + 1):
            if np.isfinite(table.value(n, depth)):
                widths = table.widths(n, depth)
                chain = len(widths) == n
                a, b = chain_work if chain and chain_work else (overhead, per_node)
                seconds = iteration_seconds(
                    widths,
                    (chain and chain_cost) or target_cost,
                    (chain and chain_draft) or draft_cost,
                    context,
                    a + b * n,
                )
                yield table.value(n, depth) / (seconds + switch * table.value(n, depth))


@pytest.mark.parametrize("seed", range(6))
def test_the_fastest_tree_is_the_fastest_of_all_sizes_and_depths(seed):
    rng = np.random.default_rng(seed)
    table = TreeTable(reach_of(rng.uniform(0.0, 0.9, size=(3, 4))), 24, 5)
    # a staircase curve with a cheap plateau (a compiled model's buckets) and a draft curve
    target_cost = ForwardCost(
        (
            tuple(0.01 * (1 + k // 4) + rng.uniform(0, 0.002) for k in range(1, 27)),
            tuple(0.02 * (1 + k // 4) for k in range(1, 27)),
        ),
        contexts=(128, 1024),
    )
    draft_cost = ForwardCost(tuple(0.001 + 0.0005 * k * rng.random() for k in range(1, 27)))
    overhead, per_node = 0.001 * seed, 0.0002 * (seed % 3)
    choice = fastest_tree(table, target_cost, draft_cost, 500, overhead, per_node=per_node)
    plain = 1.0 / (target_cost(1, 500) + overhead)
    best = max(plain, *_every_choice(table, target_cost, draft_cost, 500, overhead, per_node))
    assert choice.tokens_per_second == pytest.approx(best, rel=1e-12)
    if choice.nodes:
        assert choice.seconds == pytest.approx(
            iteration_seconds(choice.widths, target_cost, draft_cost, 500, overhead + per_node * choice.nodes)
        )
    # each kind priced as it runs: chains on a cheaper (causal) curve and their own draft factor, a plain step
    # with its own work
    chain_cost, chain_draft = target_cost.scaled(rng.uniform(0.6, 1.0)), draft_cost.scaled(rng.uniform(0.5, 1.5))
    plain_cost, plain_overhead = target_cost.scaled(rng.uniform(0.7, 1.1)), 0.0005 * seed
    kinds = fastest_tree(
        table,
        target_cost,
        draft_cost,
        500,
        overhead,
        per_node=per_node,
        plain_cost=plain_cost,
        chain_cost=chain_cost,
        chain_draft_cost=chain_draft,
        plain_overhead=plain_overhead,
    )
    best = max(
        1.0 / (plain_cost(1, 500) + plain_overhead),
        *_every_choice(table, target_cost, draft_cost, 500, overhead, per_node, chain_cost, chain_draft),
    )
    assert kinds.tokens_per_second == pytest.approx(best, rel=1e-12)
    # and a chain's own work line
    chain_work = (overhead * rng.uniform(0.2, 1.2), per_node * rng.uniform(0.5, 3.0))
    lined = fastest_tree(
        table,
        target_cost,
        draft_cost,
        500,
        overhead,
        per_node=per_node,
        plain_cost=plain_cost,
        chain_cost=chain_cost,
        chain_draft_cost=chain_draft,
        plain_overhead=plain_overhead,
        chain_overhead=chain_work,
    )
    best = max(
        1.0 / (plain_cost(1, 500) + plain_overhead),
        *_every_choice(table, target_cost, draft_cost, 500, overhead, per_node, chain_cost, chain_draft, chain_work),
    )
    assert lined.tokens_per_second == pytest.approx(best, rel=1e-12)
    # a one-time cost of drafting (a draft far behind) spread over the tokens left: each token drafting gives
    # pays `switch` more, a plain step's nothing
    switch = 0.004 * rng.random()
    switched = fastest_tree(
        table,
        target_cost,
        draft_cost,
        500,
        overhead,
        per_node=per_node,
        plain_cost=plain_cost,
        chain_cost=chain_cost,
        chain_draft_cost=chain_draft,
        plain_overhead=plain_overhead,
        chain_overhead=chain_work,
        switch=switch,
    )
    best = max(
        1.0 / (plain_cost(1, 500) + plain_overhead),
        *_every_choice(
            table, target_cost, draft_cost, 500, overhead, per_node, chain_cost, chain_draft, chain_work, switch
        ),
    )
    assert switched.tokens_per_second == pytest.approx(best, rel=1e-12)
    # with a margin, drafting only where it is that much faster than a plain step
    plain_speed = 1.0 / (plain_cost(1, 500) + plain_overhead)
    for margin in (0.0, 0.05, 0.3):
        margined = fastest_tree(
            table,
            target_cost,
            draft_cost,
            500,
            overhead,
            per_node=per_node,
            plain_cost=plain_cost,
            chain_cost=chain_cost,
            chain_draft_cost=chain_draft,
            plain_overhead=plain_overhead,
            chain_overhead=chain_work,
            margin=margin,
        )
        drafting = max(
            _every_choice(table, target_cost, draft_cost, 500, overhead, per_node, chain_cost, chain_draft, chain_work)
        )
        expected = drafting if drafting > plain_speed * (1 + margin) else plain_speed
        assert margined.tokens_per_second == pytest.approx(expected, rel=1e-12)
        assert (margined.nodes > 0) == (drafting > plain_speed * (1 + margin))


@pytest.mark.parametrize("seed", range(8))
def test_searching_small_trees_first_chooses_as_the_whole_budget(seed):
    # search_tree skips the 64-node programme only where value_bound proves no larger tree is as fast
    rng = np.random.default_rng(seed)
    rates = rng.uniform(0.3 if seed % 2 else 0.0, 0.95 if seed % 2 else 0.5, size=(6, 8))
    steps = 4 if seed < 4 else 70  # a staircase that makes large trees dear, or a nearly flat curve
    target_cost = ForwardCost(tuple(0.01 * (1 + k // steps) + 0.00001 * k for k in range(1, 70)))
    draft_cost = ForwardCost(tuple(0.001 + 0.0001 * k for k in range(1, 70)))
    reach = reach_of(rates)
    whole = TreeTable(reach, 64, 6)
    bound = value_bound(reach, 64, 6)
    assert np.all(whole.values[1:, :] <= bound[None, :] + 1e-9)  # the bound holds at every size and depth
    per_node = 0.0001 if steps == 4 else 0.0
    expected = fastest_tree(whole, target_cost, draft_cost, 300, 0.001, per_node=per_node)
    choice, table = search_tree(rates, 64, 6, target_cost, draft_cost, 300, 0.001, per_node=per_node)
    assert (choice.nodes, choice.depth, choice.tokens_per_second) == (
        expected.nodes,
        expected.depth,
        expected.tokens_per_second,
    )
    assert (
        table.tree(choice.nodes, choice.depth).parents.tolist()
        == whole.tree(expected.nodes, expected.depth).parents.tolist()
    )
    if seed % 2 and steps == 70:  # good acceptance on a flat curve: a tree beyond the first 16 nodes wins
        assert choice.nodes > 16 and table.max_nodes == 64
    if steps == 4 and seed % 2 == 0:
        assert table.max_nodes == 16  # small trees proved enough


def test_a_chain_is_priced_on_the_causal_curve_and_a_plain_step_with_its_own_work():
    # one rank-0 child accepted half the time: a one-node chain gives 1.5 tokens per call
    table = TreeTable(reach_of(np.array([[0.5, 0.0], [0.0, 0.0]])), 4, 2)
    causal, masked = ForwardCost((1.0, 1.05, 1.1, 1.2, 1.3)), ForwardCost((1.0, 1.6, 1.7, 1.8, 1.9))
    assert fastest_tree(table, masked, None, 100).nodes == 0  # a masked 2-token forward does not pay
    chosen = fastest_tree(table, masked, None, 100, chain_cost=causal)
    assert (chosen.nodes, chosen.seconds) == (1, pytest.approx(1.05))
    # drafting's work besides forwards against a plain step's: 0.6 s more per drafting iteration tips it
    assert fastest_tree(table, masked, None, 100, 0.6, chain_cost=causal, plain_overhead=0.0).nodes == 0
    assert fastest_tree(table, masked, None, 100, 0.6, chain_cost=causal).nodes == 1  # the same work for both
    # a chain's own work: light where a tree's is heavy, the chain pays again; heavy per node, it does not
    assert (
        fastest_tree(
            table, masked, None, 100, 0.6, chain_cost=causal, plain_overhead=0.0, chain_overhead=(0.05, 0.05)
        ).nodes
        == 1
    )
    assert (
        fastest_tree(
            table, masked, None, 100, 0.0, chain_cost=causal, plain_overhead=0.0, chain_overhead=(0.0, 0.6)
        ).nodes
        == 0
    )


def test_a_cost_curve_read_at_once_equals_its_points():
    curve = ForwardCost(
        ((0.010, 0.011, 0.012, 0.011, 0.020, 0.030), (0.014, 0.015, 0.017, 0.016, 0.026, 0.040)),
        contexts=(128, 1024),
        tokens=(1, 2, 3, 4, 8, 16),
        padded=16,
    )
    for context in (None, 64, 128, 700, 4000):
        assert curve.curve(40, context).tolist() == [curve(k, context) for k in range(41)]


# -- exactness on irregular and chosen trees -----------------------------------------------------


@pytest.fixture
def irregular_file(tmp_path):
    path = tmp_path / "tree.json"
    path.write_text(json.dumps(IRREGULAR))
    return str(path)


@pytest.mark.parametrize(
    "params",
    [
        {"replacement": False},
        {"replacement": True},
        {"tree": "auto"},
        {"tree": "auto", "adapt": True},
        {"tree": "auto", "acceptance": "0.9/0.6;0.8/0.5", "overhead": "0/0/1/0/0"},
    ],
)
@pytest.mark.slow
def test_irregular_and_automatic_trees_keep_the_targets_law(irregular_file, params):
    params = {"tree": irregular_file, **params}
    report = check_method("mcsd", runs=2000, pairs=2, vocab=4, n_tokens=3, seed=1, **params)
    assert report.passed, report.pairs


@pytest.mark.slow
def test_the_chains_tree_auto_picks_are_proposed_as_chains_and_keep_the_law(monkeypatch):
    from multispec.drafting.model import DraftChain
    from multispec.drafting.shape import AutoTree

    def chain_of_two(self, context, pending, room, behind=1):  # every search picks a two-node chain
        self.searches += 1
        self._use(TokenTree.chain(min(2, room)))

    monkeypatch.setattr(AutoTree, "search", chain_of_two)
    original, used = DraftChain.propose, []

    def counted(self, context, shape):
        used.append(len(shape))
        return original(self, context, shape)

    monkeypatch.setattr(DraftChain, "propose", counted)
    report = check_method("mcsd", runs=2000, pairs=2, vocab=4, n_tokens=3, seed=1, tree="auto")
    assert report.passed, report.pairs
    assert used and set(used) <= {1, 2}

    def wrong(self, context, shape):  # known wrong: the rows the rule reads are not the law the draws came from
        proposal = original(self, context, shape)
        rows = proposal.draft_probs
        proposal.draft_rows = torch.full_like(rows, 1.0 / rows.shape[-1])
        return proposal

    monkeypatch.setattr(DraftChain, "propose", wrong)
    assert not check_method("mcsd", runs=2000, pairs=2, vocab=4, n_tokens=3, seed=1, tree="auto").passed


@pytest.mark.slow
def test_algorithm_1_on_draws_without_replacement_fails_on_an_irregular_tree(irregular_file, monkeypatch):
    monkeypatch.setattr(multispec.decoding.tree, "node_rule", lambda verifier, replacement: recursive_rejection)
    report = check_method(
        "mcsd",
        runs=2000,
        pairs=2,
        vocab=4,
        n_tokens=3,
        seed=1,
        concentration=0.5,
        tree=irregular_file,
        replacement=False,
    )
    assert not report.passed


def test_tree_auto_reports_its_choices_and_is_reproducible():
    target, draft = random_markov_pair(6, 40, 2)
    # the choices read the verdicts and the per-machine curves, never this call's clock: the seed fixes them
    runs = [
        generate(
            target,
            draft,
            [1],
            method="specinfer:tree=auto,acceptance=0.5/0.2,overhead=0.3/0.01",
            max_new_tokens=30,
            seed=4,
        )
        for _ in range(3)
    ]
    assert runs[0].token_ids == runs[1].token_ids == runs[2].token_ids
    assert runs[0].stats["trees_used"] == runs[1].stats["trees_used"] == runs[2].stats["trees_used"]
    stats = runs[0].stats
    assert sum(stats["trees_used"].values()) >= 1 and stats["predicted_tokens_per_second"] > 0
    assert stats["iteration_overhead_seconds"] == {
        "per_iteration": 0.0003,
        "per_node": 0.00001,
        "plain_step": 0.0003,
        "chain": 0.0003,
        "chain_per_node": 0.00001,
        "measured": False,
    }
    assert stats["forward_factors"]["plain"] == {"target": 1.0}
    adapted = generate(target, draft, [1], method="specinfer:tree=auto,adapt=true", max_new_tokens=30, seed=4).stats
    assert (
        adapted["iteration_overhead_seconds"]["measured"] and adapted["iteration_overhead_seconds"]["per_iteration"] > 0
    )
    for bad in ("-1", "1/2/3/4", "1/2/3/4/5/6", "x", "nan"):
        with pytest.raises(ValueError, match="overhead must be milliseconds"):
            generate(target, draft, [1], method="mcsd", tree="auto", overhead=bad, max_new_tokens=3)
    for bad in ("1/1", "1/1/1/1", "0/1/1", "1/x/1"):
        with pytest.raises(ValueError, match="factors must be"):
            generate(target, draft, [1], method="mcsd", tree="auto", factors=bad, max_new_tokens=3)
    with pytest.raises(ValueError, match="factors is a parameter of tree=auto"):
        generate(target, draft, [1], method="mcsd", factors="1/1/1", max_new_tokens=3)
    tuned = generate(
        target,
        draft,
        [1],
        method="mcsd:tree=auto,overhead=0.3/0.01/0.2,factors=0.9/1.1/1.2/0.8/1.3",
        max_new_tokens=10,
        seed=4,
    ).stats
    assert tuned["iteration_overhead_seconds"]["plain_step"] == pytest.approx(0.0002)
    lined = generate(
        target, draft, [1], method="mcsd:tree=auto,overhead=0.3/0.01/0.2/0.1/0.02", max_new_tokens=10, seed=4
    ).stats["iteration_overhead_seconds"]
    assert (lined["chain"], lined["chain_per_node"]) == (pytest.approx(0.0001), pytest.approx(0.00002))
    assert tuned["forward_factors"] == {
        "plain": {"target": 0.9},
        "chain": {"target": 1.1, "draft": 0.8},
        "tree": {"target": 1.2, "draft": 1.3},
    }
    with pytest.raises(ValueError, match="adapt is a parameter of tree=auto"):
        generate(target, draft, [1], method="mcsd", adapt=True, max_new_tokens=3)
    with pytest.raises(ValueError, match="acceptance is a parameter of tree=auto"):
        generate(target, draft, [1], method="mcsd", acceptance="0.5", max_new_tokens=3)
    with pytest.raises(ValueError, match="acceptance must be rates in"):
        generate(target, draft, [1], method="mcsd", tree="auto", acceptance="0.5/2", max_new_tokens=3)
    with pytest.raises(ValueError, match="tree=auto needs drafter=model"):
        generate(target, draft, [1], method="mcsd", tree="auto", drafter="hybrid", max_new_tokens=3)


def test_tree_auto_searches_again_only_on_news(monkeypatch):
    # once no tree pays (a second per node), no verdicts come in: a scheduled search could only answer the same,
    # until the context has grown (CONTEXT_GROWTH); with adapt the measured times move, so every one runs
    import multispec.drafting.shape as shape

    target, draft = random_markov_pair(6, 200, 2)
    prompt = [i % 6 for i in range(120)]  # 60 more tokens grow the context by half
    method = "mcsd:tree=auto,overhead=0/1000"
    scheduled = sum(shape.replans(c) for c in range(1, 61))  # 1, 2, 4, 8, 16, 32, 48
    # with probes, a one-node chain at calls 16, 32 and 48, where plain steps were chosen, and a search on each
    # one's verdict at the next call: the context then never grows to 1.25 times the last search's
    probed = generate(target, draft, prompt, method=method, max_new_tokens=60, seed=3)
    assert probed.stats["tree_probes"] == 3 and probed.stats["trees_used"]["1 nodes, depth 1, widths 1"] == 3 + 3
    assert probed.stats["tree_searches"] == 3 + 3  # calls 1, 2, 4 (the first three try one node), 17, 33, 49
    monkeypatch.setattr(shape, "PROBE_EVERY", 1000)
    run = generate(target, draft, prompt, method=method, max_new_tokens=60, seed=3)
    assert run.stats["trees_used"].get("none", 0) >= 50
    # the first three calls try one node (EXPLORE); then a search at 120 * 1.25 = 150 tokens and no other
    assert run.stats["tree_searches"] == 4 < scheduled
    monkeypatch.setattr(shape.AutoTree, "_news", lambda self, context: True)
    every = generate(target, draft, prompt, method=method, max_new_tokens=60, seed=3)
    assert every.stats["tree_searches"] == scheduled
    assert every.token_ids == run.token_ids and every.stats["trees_used"] == run.stats["trees_used"]
    monkeypatch.undo()
    adapted = generate(target, draft, prompt, method=method + ",adapt=true", max_new_tokens=60, seed=3)
    assert adapted.stats["tree_searches"] >= scheduled


def test_tree_auto_spreads_a_draft_catch_up_over_the_tokens_left(monkeypatch):
    # drafting pays per iteration (a flat target curve, a cheap draft step, a high prior), but the draft must
    # first read the 40-token prompt, for 0.4 s: spread over 10 tokens that does not pay, over 150 it does
    import multispec.decoding.tree as tree_module

    target, draft = random_markov_pair(6, 200, 2)
    flat, reading = ForwardCost((0.01,) * 4, tokens=(1, 2, 3, 64)), ForwardCost((0.0001, 0.64), tokens=(1, 64))
    monkeypatch.setattr(tree_module, "forward_cost", lambda model, **kwargs: reading if model is draft else flat)
    prompt = [i % 6 for i in range(40)]
    method = "mcsd:tree=auto,acceptance=0.9/0.5,overhead=0/0/0/0/0"
    short = generate(target, draft, prompt, method=method, max_new_tokens=10, seed=3)
    assert set(short.stats["trees_used"]) == {"none"} and short.stats["draft_calls"] == 0
    long = generate(target, draft, prompt, method=method, max_new_tokens=150, seed=3)
    assert long.stats["draft_calls"] > 0 and long.stats["trees_used"].get("none", 0) < 10


def test_a_prior_by_depth_starts_tree_auto_at_the_rates_tune_priced():
    counts = RankAcceptance()
    for depth, rank, accepted in [(1, 0, 1), (1, 0, 0), (1, 1, 0), (2, 0, 1), (2, 1, 1), (2, 1, 1)] * 5:
        counts.record(depth, rank, accepted)
    text = counts.prior_text(12)
    rows = multispec.decoding.tree.parse_acceptance(text)
    # the two measured depths, then the pooled row for every deeper level
    assert len(rows) == 3 and all(len(r) == MAX_CHILDREN for r in rows)
    assert np.allclose(RankAcceptance().rates(12, rows, weight=20.0), counts.rates(12), atol=5e-4)
    assert rows[1][1] > rows[0][1]  # the depth-2 second child, accepted every time, keeps its own rate
    # the call's own counts at a depth are pulled towards that depth's row, with the weight of `weight` tries
    seen = RankAcceptance()
    for accepted in (0, 0, 0, 1):
        seen.record(2, 0, accepted)
    pulled = seen.rates(12, rows, weight=20.0)
    assert pulled[1, 0] == pytest.approx((1 + 20 * rows[1][0]) / (4 + 20))
    assert np.allclose(pulled[0], RankAcceptance().rates(12, rows, weight=20.0)[0])  # depth 1 saw nothing
    # a flat prior still means one row for every depth
    assert np.allclose(RankAcceptance().rates(3, [0.5, 0.2], weight=20.0)[:, :2], [[0.5, 0.2]] * 3)
    with pytest.raises(ValueError, match="rows per depth separated by ';'"):
        multispec.decoding.tree.parse_acceptance("0.5/0.2;1.5")
    target, draft = random_markov_pair(6, 40, 2)
    out = generate(target, draft, [1], method=f"mcsd:tree=auto,acceptance={text}", max_new_tokens=8, seed=0)
    assert len(out.token_ids) == 8


def test_tree_auto_prices_the_first_call_as_a_steady_one_and_a_prior_skips_the_one_node_tries(monkeypatch):
    # a bucketed curve: a forward over the 40-token prompt costs what one over 64 does, so priced with the prompt
    # pending, a tree riding on the prompt's forward looks free; a steady step pays 10 ms per extra token
    import multispec.decoding.tree as tree_module
    import multispec.drafting.shape as shape_module

    steps = ForwardCost((0.010, 0.020, 0.030, 0.100, 0.100), tokens=(1, 2, 3, 64, 128))
    monkeypatch.setattr(tree_module, "forward_cost", lambda model, **kwargs: steps)
    target, draft = random_markov_pair(6, 200, 2)
    prompt = [i % 6 for i in range(40)]
    method = "mcsd:tree=auto,acceptance=0.5/0.2,overhead=0/0/0/0/0"
    run = generate(target, draft, prompt, method=method, max_new_tokens=40, seed=3)
    # no iteration drafts: a one-node chain gives 1.5 tokens for twice a plain step's cost, the prior stands for
    # the one-node tries a call without one makes first, and no probe makes the draft read the prompt
    assert set(run.stats["trees_used"]) == {"none"} and run.stats["draft_calls"] == 0
    assert run.stats["tree_probes"] == 0
    bare = generate(target, draft, prompt, method="mcsd:tree=auto,overhead=0/0/0/0/0", max_new_tokens=15, seed=3)
    assert bare.stats["trees_used"].get("1 nodes, depth 1, widths 1", 0) >= 1

    # known wrong: priced with the prompt pending (at the first call every context token is), it drafts a tree
    # into the prompt's forward
    original = shape_module.AutoTree.search

    def with_the_prompt_pending(self, context, pending, room, behind=1):
        return original(self, context, context if self.calls == 1 else pending, room, behind)

    monkeypatch.setattr(shape_module.AutoTree, "search", with_the_prompt_pending)
    wrong = generate(target, draft, prompt, method=method, max_new_tokens=15, seed=3)
    assert wrong.stats["draft_calls"] > 0


# -- tune and plan files ------------------------------------------------------------------------


def test_tune_writes_a_plan_that_generate_and_bench_use(tmp_path):
    from multispec.tools.bench import Prompt
    from multispec.tools.tune import load_plan, tune, write_plan
    from tests.conftest import tiny_llama

    target, draft = tiny_llama(seed=0), tiny_llama(seed=1, layers=1)
    prompts = [Prompt(f"p:{i}", "toy", list(range(1 + i, 9 + i))) for i in range(4)]
    result = tune(target, draft, prompts, temperature=1.0, max_new_tokens=12, measure=2)
    measured = [c for c in result.candidates if c.measured_tokens_per_second is not None]
    # the best two, the best sd chain and ar
    assert 2 <= len(measured) <= 4 and any(c.method == "ar" for c in measured)
    best_chain = max((c for c in result.candidates if c.method == "sd"), key=lambda c: c.predicted_tokens_per_second)
    assert best_chain.measured_tokens_per_second is not None
    assert set(result.probe["forward_factors"]) == {"tree", "chain", "sd", "ar"}
    assert result.chosen.measured_tokens_per_second == max(c.measured_tokens_per_second for c in measured)
    assert result.ranks.tries[0, 0] > 0 and all(c.predicted_tokens_per_second > 0 for c in result.candidates)
    labels = {c.label.split(":")[0].split(",")[0] for c in result.candidates}
    assert {"ar", "sd", "mcsd"} <= labels and any("tree=auto" in c.label for c in result.candidates)
    # tree=auto is offered with every measured price: each kind's work besides forwards (a tree iteration's, a
    # plain step's, a chain's line, kept in the evidence too) and each kind's forward factors
    auto = next(c for c in result.candidates if "tree=auto" in c.label)
    chain = result.probe["chain_overhead_seconds"]
    assert len(chain) == 2 and chain[0] >= 0 and chain[1] >= 0
    work = [float(x) / 1000 for x in auto.params["overhead"].split("/")]
    assert work == pytest.approx([*result.overhead, result.ar_overhead, *chain], abs=1e-7)
    scaled = result.probe["forward_factors"]
    assert [float(x) for x in auto.params["factors"].split("/")] == pytest.approx(
        [scaled["ar"], scaled["chain"][0], scaled["tree"][0], scaled["chain"][1], scaled["tree"][1]], abs=1e-4
    )
    # sd's own line from sd runs of two lengths on the chain probes' prompts (1 and 3)
    assert result.probe["sd_chains"] == [4, 1] and min(result.probe["sd_overhead_seconds"]) >= 0
    # ar is priced from runs on three prompts; the output length pools every run before the measurements (4
    # probes, the one-node chain, 3 ar runs, 2 sd runs), and every candidate spreads its prefill over it
    assert result.probe["ar_prompts"] == 3 and result.probe["expected_new_tokens"]["runs"] == 10
    assert 0 < result.probe["expected_new_tokens"]["mean"] <= 12
    assert {c.new_tokens for c in result.candidates} == {result.probe["expected_new_tokens"]["mean"]}
    assert all(v > 0 for v in result.probe["prefill_seconds"].values())
    path = write_plan(result, tmp_path / "plan.json", {"target": target.name, "draft": draft.name})
    plan = load_plan(path)
    assert plan.data["evidence"]["candidates"] and plan.spec.startswith(result.chosen.method)
    out = generate(target, draft, [1, 2, 3], method=plan.spec, max_new_tokens=6, seed=0)
    assert len(out.token_ids) == 6
    # a plan whose tree is not 'auto' names its tree file beside the plan
    tree_plan = dict(plan.data, method="mcsd", params={"tree": "p.tree.json"})
    (tmp_path / "p.tree.json").write_text(json.dumps({"parents": IRREGULAR}))
    (tmp_path / "p.json").write_text(json.dumps(tree_plan))
    spec = load_plan(tmp_path / "p.json").spec
    assert spec == f"mcsd:tree={tmp_path / 'p.tree.json'}"
    assert len(generate(target, draft, [1, 2, 3], method=spec, max_new_tokens=6).token_ids) == 6


def test_tune_prices_tree_auto_as_plain_steps_when_its_choice_is_no_drafting(monkeypatch):
    # tree=auto decodes without drafts when no tree pays (after its first one-node tries): tune must predict
    # that, not a one-node chain (a translation tune priced tree=auto 1.65x below what it then ran at)
    import multispec.tools.tune
    from multispec.tools.bench import Prompt
    from multispec.tree_search import TreeChoice
    from tests.conftest import tiny_llama

    monkeypatch.setattr(multispec.tools.tune, "fastest_tree", lambda *a, **k: TreeChoice(0, 0, 1.0, 0.05, ()))
    # the search's share per call is timed on this machine (a loaded one takes longer): fixed here
    monkeypatch.setattr(multispec.tools.tune, "_search_seconds", lambda *a, **k: 0.002)
    target, draft = tiny_llama(seed=0), tiny_llama(seed=1, layers=1)
    prompts = [Prompt(f"p:{i}", "toy", list(range(1 + i, 9 + i))) for i in range(2)]
    result = multispec.tools.tune.tune(target, draft, prompts, temperature=1.0, max_new_tokens=8, measure=1)
    auto = next(c for c in result.candidates if "tree=auto" in c.label)
    assert auto.tree is None and auto.tokens == 1.0
    plain = next(c for c in result.candidates if c.label == "ar")
    # priced as ar's steps, and the search spread over its calls
    assert auto.seconds == pytest.approx(plain.seconds + 0.002)
    assert not any(c.label == "mcsd, the fastest optimal tree" for c in result.candidates)


def test_tune_warms_each_kind_up_before_it_times_it(monkeypatch):
    # a kind's first run in a process paid for its step's first use (11.1 ms a step against 8.0 later) and priced
    # ar: every kind tune times runs a few tokens untimed first, the probe's kinds before the probe and the
    # measured candidates before their measurements
    import multispec.tools.tune
    from multispec.tools.bench import Prompt
    from tests.conftest import tiny_llama

    calls, original = [], multispec.tools.tune._run

    def recorded(target, draft, prompts, method, params, settings, first=0):
        calls.append((method, params.get("gamma"), str(params.get("tree")), settings["max_new_tokens"]))
        return original(target, draft, prompts, method, params, settings, first)

    monkeypatch.setattr(multispec.tools.tune, "_run", recorded)
    target, draft = tiny_llama(seed=0), tiny_llama(seed=1, layers=1)
    prompts = [Prompt(f"p:{i}", "toy", list(range(1 + i, 9 + i))) for i in range(2)]
    result = multispec.tools.tune.tune(target, draft, prompts, temperature=0.0, max_new_tokens=12, measure=1)
    short = multispec.tools.tune.WARM_UP_TOKENS
    timed = [c for c in calls if c[3] == 12]
    assert timed and all(c[3] in (short, 12) for c in calls)
    first_timed = calls.index(timed[0])
    warmed_first = {c[:3] for c in calls[:first_timed]}
    assert all(c[3] == short for c in calls[:first_timed])
    # the probe's kinds: ar, sd chains of 4 and 1, mcsd's wide tree and its chains of 4 and 1
    assert {("ar", None), ("sd", 4), ("sd", 1)} <= {c[:2] for c in warmed_first}
    assert sum(c[0] == "mcsd" for c in warmed_first) == 3
    # every measured candidate ran short once more after the probe and before its measurements
    measured = [c for c in result.candidates if c.measured_tokens_per_second is not None]
    measuring = len(measured) * len(prompts)  # the last calls
    assert all(c[3] == 12 for c in calls[-measuring:])
    assert all(c[3] == short for c in calls[-measuring - len(measured) : -measuring])


def test_a_candidate_spreads_its_prefill_over_the_expected_output():
    from multispec.tools.tune import Candidate

    # 2 tokens per 10 ms iteration, 0.5 s of prompt over 100 new tokens: 5 ms + 5 ms a token
    c = Candidate("x", "sd", {}, None, tokens=2.0, seconds=0.010, prefill=0.5, new_tokens=100)
    assert c.predicted_tokens_per_second == pytest.approx(100.0)
    # a shorter expected output carries more of the prompt's forward per token
    assert Candidate("x", "sd", {}, None, 2.0, 0.010, 0.5, 50).predicted_tokens_per_second == pytest.approx(1 / 0.015)


def test_stats_hold_the_prompts_forward_apart():
    # the target's first forward (the prompt) is timed on its own: a call of one new token is that forward
    # alone; with more tokens it is a part of the target's time. tune prices prefill from it.
    from tests.conftest import tiny_llama

    target, draft = tiny_llama(seed=0), tiny_llama(seed=1, layers=1)
    one = generate(target, None, list(range(1, 40)), method="ar", max_new_tokens=1).stats
    assert one["target_calls"] == 1 and one["prefill_seconds"] == one["target_seconds"] > 0
    many = generate(target, draft, list(range(1, 40)), method="sd", gamma=2, max_new_tokens=12).stats
    assert 0 < many["prefill_seconds"] < many["target_seconds"]
    assert 0 < many["draft_prefill_seconds"] < many["draft_seconds"]


def test_a_file_that_is_not_a_plan_is_refused(tmp_path):
    from multispec.tools.tune import load_plan

    path = tmp_path / "x.json"
    path.write_text('{"method": "sd"}')
    with pytest.raises(ValueError, match="is not a plan file written by multispec tune"):
        load_plan(path)
    proc = subprocess.run(
        [sys.executable, "-m", "multispec.entrypoints.cli", "generate", "hi", "--plan", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "not a plan file" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "multispec.entrypoints.cli", "tune", "--limit", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "--limit >= 2" in proc.stderr


def test_a_run_that_differs_from_what_its_plan_was_priced_on_is_told_so():
    # eager and compiled forwards have cost curves of other shapes (on one CPU, tune chose a 4-node tree eager and
    # sd gamma 1 compiled): a plan used with other flags, models or on another host says so; a matching run is quiet
    from multispec.tools.tune import Plan, plan_mismatches

    tuned = {"target": "T - bfloat16, compiled", "draft": "D - bfloat16, compiled"}
    plan = Plan("sd:gamma=1", {"models": tuned, "machine": {"host": "box"}})
    assert plan_mismatches(plan, dict(tuned), host="box") == []
    assert plan_mismatches(plan, {"target": tuned["target"]}, host="box") == []  # ar loads no draft
    eager = plan_mismatches(plan, {"target": "T - bfloat16", "draft": "D - bfloat16"}, host="box")
    assert len(eager) == 2 and "'T - bfloat16, compiled'; this run loads 'T - bfloat16'" in eager[0]
    assert eager[-1].endswith("run `multispec tune` here with this run's flags")
    other = plan_mismatches(plan, {"big": "B - float32", **{"draft": tuned["draft"]}}, host="box")
    assert other == [
        "the plan was tuned on target / draft; this run loads big: its choice was priced on other "
        "forwards; run `multispec tune` here with this run's flags"
    ]
    moved = plan_mismatches(plan, dict(tuned), host="laptop")
    assert len(moved) == 1 and "tuned on host 'box'; this is 'laptop'" in moved[0]
