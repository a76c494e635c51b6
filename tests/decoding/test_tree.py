"""Token trees and the tree methods: layout, bad input, every model family, greedy and batch equivalence,
the exactness checker on `mcsd`, `specinfer` and `batch-sd`, and the known-wrong variants failing it."""

import pytest
import torch

from multispec import generate
from multispec.decoding import get_method
from multispec.drafting import DraftChain, DraftTree, setup_of, top_children
from multispec.engine import Entries, ModelRunner, Session
from multispec.models.markov import random_markov_pair
from multispec.tools.check import check_method
from multispec.trees import MAX_TREE_NODES, TokenTree, parse_k_config
from multispec.verify import Verdict
from multispec.warp import Sampling
from tests.conftest import FAMILIES, tiny_family, tiny_llama
from tests.wrong_rules import dedupe_rejection, sorted_rejection

RUNS = 3000  # law checks of the tree methods: outputs per random pair

PROMPT = [5, 17, 3, 42, 8, 11, 9, 30]


def test_from_branching_layout():
    tree = TokenTree.from_branching([2, 2])  # MCSD §3.9 worked example
    assert tree.parents.tolist() == [-1, -1, 0, 0, 1, 1]
    assert tree.children(-1) == (0, 1) and tree.children(0) == (2, 3) and tree.children(1) == (4, 5)
    assert tree.depth.tolist() == [1, 1, 2, 2, 2, 2]
    assert tree.visible[4].nonzero().flatten().tolist() == [1, 4]
    assert not tree.visible[2, 3] and not tree.visible[0, 1]  # siblings never see each other
    big = TokenTree.from_branching([4, 2, 2])
    assert big.size == 28 and big.level(3) == slice(12, 28)
    assert big.children(5) == (4 + 5 * 2 - 4 + 4, 4 + 5 * 2 - 4 + 5)  # child c of depth-2 node i: 12 + 2i + c
    assert big.path(27) == [3, 11, 27]
    assert TokenTree.from_branching([1, 1, 1]).is_chain


@pytest.mark.parametrize("bad", ["4x0", "abc", "", "0", "2x-1", "4x2.5", "x"])
def test_malformed_k_configs_are_refused(bad):
    with pytest.raises(ValueError, match="k_config"):
        parse_k_config(bad)
    with pytest.raises(ValueError, match="k_config"):
        generate(*random_markov_pair(4, 20, 0), [0], method="mcsd", k_config=bad, max_new_tokens=3)


def test_tree_above_the_node_limit_is_refused():
    assert parse_k_config("8x4x4") == (8, 4, 4)  # 8 + 32 + 128 nodes
    with pytest.raises(ValueError, match=str(MAX_TREE_NODES)):
        parse_k_config("16x16")  # 272 nodes
    with pytest.raises(ValueError, match="node"):
        TokenTree.from_parents([-1] * (MAX_TREE_NODES + 1))


def test_more_candidates_than_the_warped_support_are_padding():
    # top_k = 2 leaves two tokens per row, below k = 3: the third child is padding, never accepted
    t, d = random_markov_pair(4, 30, seed=5)
    r = generate(t, d, [0], method="mcsd", k_config="3x3", replacement=False, top_k=2, max_new_tokens=20, seed=1)
    assert len(r.token_ids) == 20
    report = check_method(
        "mcsd", runs=3000, pairs=1, vocab=4, n_tokens=3, seed=4, top_k=2, k_config="3x2", replacement=False
    )
    assert report.passed, report.pairs


def test_runner_refuses_to_keep_an_entry_never_fed():
    model = tiny_llama()
    runner = ModelRunner(model)
    runner.feed([PROMPT], Entries.chain([1, 2]))  # a chain of two tentative entries
    with pytest.raises(RuntimeError, match="fed"):
        runner.commit(len(PROMPT) + 3, [[0, 1, 2]])
    runner = ModelRunner(model)
    runner.feed([PROMPT], Entries.tree(TokenTree.from_branching([3]), torch.tensor([1, 2, 3])))
    with pytest.raises(RuntimeError, match="path"):
        runner.commit(len(PROMPT) + 3, [[0, 1]])  # siblings are not a path
    with pytest.raises(RuntimeError, match="chain"):
        runner.feed([PROMPT], Entries.chain([4]))  # a causal chain after siblings would see both
    runner.commit(len(PROMPT) + 2, [[1]])  # one sibling is a path


def test_a_tree_fed_level_by_level_then_other_entries_scores_as_when_built_feed_by_feed():
    # the runner keeps a tree's fed levels as a prefix of the tree; entries of another kind after them must
    # see what they would see had each feed's visibility been built up (the general path)
    model = tiny_llama(seed=4)
    tree = TokenTree.from_branching([2, 2])
    tokens = torch.tensor([9, 4, 33, 21, 7, 2])

    def run(as_tree: bool):
        runner = ModelRunner(model)
        runner.feed([PROMPT])
        for level in (slice(0, 2), slice(2, 6)):
            e = Entries.tree(tree, tokens[level], level)
            runner.feed([PROMPT], e if as_tree else Entries(e.tokens, e.depth, e.sees))
        # a child of node 2 (depth 3): it sees its ancestors, nodes 0 and 2
        last = runner.feed([PROMPT], Entries.lists([[(11, 3, (0, 2))]], runner.tentative))
        runner.commit(len(PROMPT) + 4, [[0, 2, 6]])
        after = runner.feed([PROMPT + [9, 33, 11, 5]])
        return last, after

    (last, after), (want_last, want_after) = run(True), run(False)
    assert torch.allclose(last, want_last, atol=1e-6) and torch.allclose(after, want_after, atol=1e-6)
    runner = ModelRunner(model)
    runner.feed([PROMPT], Entries.tree(tree, tokens[:2], slice(0, 2)))
    runner.feed([PROMPT], Entries.tree(tree, tokens[2:], slice(2, 6)))
    with pytest.raises(RuntimeError, match="path"):
        runner.commit(len(PROMPT) + 3, [[0, 4]])  # node 4 is a child of node 1, not of node 0
    runner.commit(len(PROMPT) + 3, [[1, 4]])  # node 1 and its first child


@pytest.mark.parametrize("family", FAMILIES)
def test_tree_methods_on_every_family(family):
    # the target as its own draft accepts every depth; greedy output equals greedy ar token for token
    model = tiny_family(family)
    ar = generate(model, None, PROMPT, method="ar", temperature=0, max_new_tokens=14).token_ids
    # 14 tokens: batch-sd commits 3 + 3 + 3 + 3 + 2 (the budget cuts the last tree), mcsd 4 + 4 + 4 + 2
    for method, params, calls in [("batch-sd", {"drafts": 2, "gamma": 2}, 5), ("mcsd", {"k_config": "2x2x1"}, 4)]:
        r = generate(model, model, PROMPT, method=method, temperature=0, max_new_tokens=14, **params)
        assert r.token_ids == ar, (family, method)
        assert r.stats["rejections"] == 0 and r.stats["target_calls"] == calls, (family, method, r.stats)


@pytest.mark.parametrize("family", ["Llama", "Mistral", "Gemma2"])
def test_tree_masked_logits_equal_each_path(family):
    model = tiny_family(family, seed=3)
    tree = TokenTree.from_branching([2, 2, 1])
    tokens = torch.randint(0, 64, (tree.size,), generator=torch.Generator().manual_seed(0))
    runner = ModelRunner(model)
    runner.feed([PROMPT[:-1]])
    logits = runner.feed([PROMPT], Entries.tree(tree, tokens))[0]
    for g in range(tree.size):
        with torch.no_grad():
            ref = model.model(torch.tensor([PROMPT + tokens[tree.path(g)].tolist()])).logits[0, -1].float()
        assert torch.allclose(logits[1 + g], ref, atol=1e-4), (family, g)


def test_greedy_tree_methods_equal_greedy_ar_on_tiny_llama():
    model, draft = tiny_llama(seed=0), tiny_llama(seed=1)
    ar = generate(model, None, PROMPT, method="ar", temperature=0, max_new_tokens=30).token_ids
    for method, params in [
        ("mcsd", {"k_config": "4x2x1x1"}),
        ("mcsd", {"k_config": "2x2", "replacement": True}),
        ("mcsd", {"verifier": "naive"}),
        ("specinfer", {}),
        ("batch-sd", {"drafts": 3}),
    ]:
        assert (
            generate(model, draft, PROMPT, method=method, temperature=0, max_new_tokens=30, **params).token_ids == ar
        ), method


def test_batch_rows_give_the_same_tokens_as_tree_attention():
    model, draft = tiny_llama(seed=0), tiny_llama(seed=1)
    for seed in range(3):
        runs = [
            generate(
                model,
                draft,
                PROMPT,
                method="mcsd",
                k_config="2x2x1",
                temperature=1.0,
                max_new_tokens=24,
                seed=seed,
                tree_attention=flag,
            )
            for flag in (True, False)
        ]
        assert runs[0].token_ids == runs[1].token_ids
        assert runs[0].stats["target_calls"] == runs[1].stats["target_calls"]


def test_specinfer_is_mcsd_on_the_same_tree():
    t, d = random_markov_pair(5, 40, seed=2)
    for replacement in (True, False):
        for seed in range(3):
            a = generate(
                t, d, [0], method="specinfer", k_config="1x3x1", replacement=replacement, max_new_tokens=30, seed=seed
            )
            b = generate(
                t, d, [0], method="mcsd", k_config="1x3x1", replacement=replacement, max_new_tokens=30, seed=seed
            )
            assert a.token_ids == b.token_ids


def test_mcsd_continues_from_its_compacted_cache():
    # after the last commit, both of the session's own caches must continue like a fresh forward over the
    # committed sequence
    model, draft = tiny_llama(seed=0), tiny_llama(seed=1)
    s = Session(model, draft, PROMPT, Sampling(1.0), 20, torch.Generator().manual_seed(5))
    mcsd = get_method("mcsd")
    mcsd.run(s, **mcsd.resolve({"k_config": "3x2x1"}))
    assert s.counters["rejections"] > 0 and s.counters["accepted"] > 0  # paths other than node 0 were kept
    for runner, m in ((s.target, model), (s.draft, draft)):
        with torch.no_grad():
            ref = m.model(torch.tensor([s.tokens])).logits[0, -1].float()
        assert torch.allclose(runner.feed([s.tokens])[0, -1], ref, atol=1e-4)


def session(prompt=(0,), budget=10, eos=None):
    t, d = random_markov_pair(6, 30, seed=0)
    t.eos_token_id = eos
    return Session(t, d, list(prompt), Sampling(1.0), budget, torch.Generator().manual_seed(0))


def test_commit_cuts_at_an_eos_inside_the_accepted_path():
    s = session(eos=3)
    tree = TokenTree.from_branching([2, 1, 1])
    s.target.feed([s.tokens], Entries.tree(tree, torch.tensor([1, 2, 3, 4, 5, 0])))
    s.commit(Verdict((1, 3, 5), (2, 3, 0), 4, False), drafted=3)  # EOS is the second accepted token
    assert s.new_tokens == [2, 3] and s.stopped == "eos"
    assert s.counters["accepted"] == 3 and s.counters["iterations"] == 1
    assert s.target.committed == 2 and s.target.tentative == 0  # prompt + node 1; the EOS itself uncached


def test_commit_cuts_at_the_budget_inside_the_accepted_path():
    s = session(budget=2)
    tree = TokenTree.from_branching([1, 1, 1])
    s.target.feed([s.tokens], Entries.tree(tree, torch.tensor([1, 2, 4])))
    s.commit(Verdict((0, 1, 2), (1, 2, 4), 5, False), drafted=3)
    assert s.new_tokens == [1, 2] and s.stopped == "length"
    assert s.target.committed == 2  # prompt + the first draft; the last uncached


def test_a_model_drafter_keeps_the_accepted_nodes_it_fed_and_drops_the_rest():
    s = session(budget=10)
    drafter = DraftTree(s.draft_runner(), setup_of(s))
    proposal = drafter.propose(s.tokens, (2, 2, 1))  # levels 1 and 2 fed (6 entries), level 3 not
    assert s.draft.tentative == 6
    path = (1, 4)  # node 1 at depth 1, its second child at depth 2
    assert proposal.tree.is_root_path(list(path))
    verdict = Verdict(path, tuple(int(proposal.tokens[g]) for g in path), 0, True)
    s.commit(verdict, drafted=3)
    drafter.accept(verdict)
    assert s.draft.committed == 1 + 2 and s.draft.tentative == 0  # prompt + both accepted nodes
    fresh = s.draft_model.forward(s.draft_model.new_cache(), torch.tensor([s.tokens]))[0, -1]
    assert torch.allclose(s.draft.feed([s.tokens])[0, -1], fresh, atol=1e-6)


def test_greedy_model_drafters_make_their_draft_rows_when_first_read():
    # at temperature 0 the draft rows are left unmade (the greedy rules decide from the target's argmax); read,
    # they are what a rule needs: a tree's top-k rows after each parent's path, a chain's one-hot rows
    t, d = random_markov_pair(6, 30, seed=0)
    s = Session(t, d, [0], Sampling(0.0), 10, torch.Generator().manual_seed(0))
    proposal = DraftTree(s.draft_runner(), setup_of(s)).propose(s.tokens, (2, 2, 1))
    assert not isinstance(proposal.draft_rows, torch.Tensor)
    tree, rows = proposal.tree, proposal.draft_probs
    parents = [-1] + [g for g in range(tree.size) if tree.children(g)]
    assert rows.shape == (len(parents), d.vocab_size)
    for row, g in zip(rows, parents, strict=True):
        path = [] if g < 0 else proposal.tokens[tree.path(g)].tolist()
        logits = d.forward(d.new_cache(), torch.tensor([s.tokens + path]))[0, -1:]
        assert torch.allclose(row, top_children(logits, len(tree.children(g)))[2][0], atol=1e-6)
    s = Session(t, d, [0], Sampling(0.0), 10, torch.Generator().manual_seed(0))
    chain = DraftChain(s.draft_runner(), setup_of(s)).propose(s.tokens, (1, 1, 1))
    assert not isinstance(chain.draft_rows, torch.Tensor)
    assert torch.equal(chain.draft_probs, torch.nn.functional.one_hot(chain.tokens, d.vocab_size).float())


@pytest.mark.parametrize(
    "method, params, sampling",
    [
        ("mcsd", {"k_config": "2x2", "replacement": True}, {}),
        ("mcsd", {"k_config": "2x2", "replacement": False}, {}),
        ("mcsd", {"k_config": "3x2", "replacement": True}, {}),
        ("mcsd", {"k_config": "3x2", "replacement": False}, {"temperature": 0.7, "top_p": 0.9}),
        ("mcsd", {"k_config": "2x1x2", "replacement": False}, {}),
        ("mcsd", {"k_config": "2x1x2", "replacement": True}, {}),
        ("mcsd", {"k_config": "3x2", "verifier": "naive"}, {}),
        ("mcsd", {"k_config": "2x2", "tree_attention": False}, {}),
        ("specinfer", {"k_config": "1x3x1"}, {}),
        ("specinfer", {"k_config": "1x3x1", "replacement": False}, {}),
    ],
)
@pytest.mark.slow
def test_tree_methods_pass_the_checker(method, params, sampling):
    report = check_method(method, runs=RUNS, pairs=2, vocab=4, n_tokens=3, seed=1, **sampling, **params)
    assert report.passed, report.pairs


@pytest.mark.parametrize("params", [{"k_config": "2x2", "replacement": False}, {"k_config": "2x2x1"}])
def test_tree_methods_pass_on_full_history_models(params):
    report = check_method("mcsd", runs=3000, pairs=1, vocab=3, n_tokens=3, seed=2, models="history", **params)
    assert report.passed, report.pairs


@pytest.mark.parametrize(
    "params, wrong",
    [
        ({"k_config": "3x2", "replacement": True}, dedupe_rejection),  # skipping duplicate candidates
        ({"k_config": "3x2", "replacement": False}, sorted_rejection),  # sorting candidates by the draft
        (
            {"k_config": "3x2", "replacement": False},  # without replacement, Algorithm 1's residual
            __import__("multispec.verify", fromlist=["x"]).recursive_rejection,
        ),
    ],
)
@pytest.mark.slow
def test_plausible_mistakes_fail_the_checker(params, wrong, monkeypatch):
    import multispec.decoding.tree

    monkeypatch.setattr(multispec.decoding.tree, "node_rule", lambda verifier, replacement: wrong)
    report = check_method("mcsd", runs=RUNS, pairs=2, vocab=4, n_tokens=3, seed=1, concentration=0.5, **params)
    assert not report.passed


def test_dtype_names_are_checked():
    from multispec.api import parse_dtype

    assert parse_dtype("bfloat16") == torch.bfloat16 and parse_dtype(None) is None
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16"):
        parse_dtype("float8")
