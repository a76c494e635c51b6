"""Copying drafters (lookup, suffix, hybrid), fixed nodes in verification, and the draft-length controller."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from multispec import generate
from multispec.drafting import Lookup, NgramIndex, Option, Proposal, Setup, Suffix, fixed_proposal, setup_of
from multispec.drafting.length import EXPLORE, DraftLength
from multispec.models.cost import _COSTS, ForwardCost, cost_key, forward_cost
from multispec.models.markov import random_markov_pair
from multispec.tools.check import check_method
from multispec.trees import TokenTree
from multispec.verify import recursive_rejection, tree_verify
from multispec.warp import Sampling

RUNS = 3000


SETUP = Setup(Sampling(1.0), torch.Generator(), 10, torch.device("cpu"))


# -- the n-gram index and the two copying drafters --------------------------------------------------------


def test_index_finds_the_longest_match_and_every_occurrence():
    index = NgramIndex(1, 3)
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 2, 3]
    n, positions = index.match(tokens)
    assert n == 2  # (7, 2, 3) never occurred before; (2, 3) twice
    assert positions == [3, 7]  # followed by 9, then by 7
    tokens.append(5)
    assert index.match(tokens) == (0, [])  # 5 never occurred before


def test_index_updated_token_by_token_equals_one_built_at_once():
    tokens = torch.randint(4, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    step, whole = NgramIndex(1, 3), NgramIndex(1, 3)
    for i in range(1, len(tokens) + 1):
        step.update(tokens[:i])
    whole.update(tokens)
    assert step.tables == whole.tables


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.integers(1, 2), st.integers(0, 3))
def test_index_match_agrees_with_a_brute_force_search(tokens, min_n, extra):
    max_n = min_n + extra
    n, positions = NgramIndex(min_n, max_n).match(tokens)
    for m in range(min(max_n, len(tokens)), min_n - 1, -1):
        suffix = tokens[-m:]
        found = [p for p in range(m, len(tokens)) if tokens[p - m : p] == suffix]
        if found:
            assert (n, positions) == (m, found)
            break
    else:
        assert (n, positions) == (0, [])


def test_lookup_copies_what_followed_the_latest_occurrence():
    copy = Lookup(SETUP, 1, 3).find([5, 6, 1, 5, 6, 2, 8, 5, 6], (1, 1, 1))
    assert copy.tokens == [2, 8, 5] and copy.key == "lookup:2"
    assert copy.parents == [-1, 0, 1]


def test_suffix_proposes_the_most_frequent_continuation_and_a_tree_of_the_top_ones():
    s = [5, 1, 2, 5, 1, 2, 5, 3, 4, 5]
    chain = Suffix(SETUP, 1, 1).find(s, (1, 1))
    assert chain.tokens == [1, 2] and chain.counts == [2, 2]  # 5 -> 1 twice, 5 -> 3 once
    tree = Suffix(SETUP, 1, 1).find(s, (2, 1))
    assert tree.tokens == [1, 3, 2, 4] and tree.parents == [-1, -1, 0, 1] and tree.counts == [2, 1, 2, 1]


def test_fixed_proposal_rows_are_one_hot_on_each_parents_first_child():
    s = [5, 1, 2, 5, 1, 2, 5, 3, 4, 5]
    p = fixed_proposal(SETUP, Suffix(SETUP, 1, 1).find(s, (2, 1)))
    assert p.fixed.all() and p.tree.size == 4
    assert p.draft_probs.shape == (3, 10)  # root, node 0, node 1
    assert p.draft_probs[0, 1] == 1 and p.draft_probs[1, 2] == 1 and p.draft_probs[2, 4] == 1
    assert torch.equal(p.draft_probs.sum(-1), torch.ones(3))


# -- fixed nodes in tree verification ----------------------------------------------------------------------


def _verify_fixed(target_rows, tokens, parents, seed):
    tree = TokenTree.from_parents(parents)
    n = len(tokens)
    return tree_verify(
        tree,
        torch.tensor(tokens),
        torch.tensor(target_rows, dtype=torch.float64),
        torch.zeros(1, len(target_rows[0]), dtype=torch.float64),
        torch.Generator().manual_seed(seed),
        recursive_rejection,
        True,
        None,
        torch.ones(n, dtype=torch.bool),
    )


def test_a_fixed_child_the_target_is_sure_of_always_passes_and_one_it_excludes_never():
    rows = [[0.0, 1.0, 0.0], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]]
    for seed in range(20):
        v = _verify_fixed(rows, [1, 0], [-1, -1], seed)
        assert v.accepted[:1] == (0,)
        v = _verify_fixed([[0.5, 0.0, 0.5], *rows[1:]], [1, 2], [-1, -1], seed)
        assert 0 not in v.accepted


def test_two_fixed_children_give_the_target_law_at_the_root():
    # children 0 and 1 of the root, both fixed: the first token of the output must follow the target's row
    target = [0.5, 0.3, 0.2]
    rows = [target, [1 / 3] * 3, [1 / 3] * 3]
    counts = torch.zeros(3)
    for seed in range(4000):
        v = _verify_fixed(rows, [0, 1], [-1, -1], seed)
        counts[v.new_tokens[0]] += 1
    assert torch.allclose(counts / counts.sum(), torch.tensor(target), atol=0.03)


def test_verifying_a_second_fixed_child_against_the_first_childs_row_is_biased():
    # the mistake the `fixed` mask prevents: reading a one-hot row that belongs to the sibling
    target = torch.tensor([[0.5, 0.3, 0.2], [1 / 3] * 3, [1 / 3] * 3], dtype=torch.float64)
    draft = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)  # one-hot on child 0's token
    tree = TokenTree.from_parents([-1, -1])
    counts = torch.zeros(3)
    for seed in range(4000):
        v = tree_verify(tree, torch.tensor([0, 1]), target, draft, torch.Generator().manual_seed(seed))
        counts[v.new_tokens[0]] += 1
    assert (counts / counts.sum() - target[0].float()).abs().max() > 0.1


# -- exactness of the methods with copying drafters ------------------------------------------------------


@pytest.mark.parametrize(
    "method, params, sampling",
    [
        ("sd", {"gamma": 3, "drafter": "lookup"}, {}),
        ("sd", {"gamma": 2, "drafter": "suffix", "max_ngram": 2}, {"temperature": 0.7, "top_p": 0.9}),
        ("sd", {"gamma": 3, "drafter": "hybrid"}, {}),
        ("batch-sd", {"drafts": 3, "gamma": 2, "drafter": "suffix"}, {}),  # several fixed children per node
        ("batch-sd", {"drafts": 2, "gamma": 2, "drafter": "hybrid"}, {}),  # fixed and drawn children together
        ("mcsd", {"k_config": "2x2", "drafter": "hybrid"}, {}),  # draws without replacement, and a copy
        ("specinfer", {"k_config": "1x2", "drafter": "suffix"}, {"top_k": 2}),
    ],
)
@pytest.mark.slow
def test_copying_drafters_pass_the_checker(method, params, sampling):
    report = check_method(method, runs=RUNS, pairs=2, vocab=3, n_tokens=4, seed=3, **sampling, **params)
    assert report.passed, report.pairs


class _UniformRows(Lookup):
    """A plausible mistake: the copy verified against a flat draft row instead of its one-hot row (and no
    fixed mask), so a copied token passes with min(1, V * target) - far too often."""

    def propose(self, context, shape):
        p = super().propose(context, shape)
        flat = torch.full_like(p.draft_probs, 1 / p.draft_probs.shape[-1])
        return Proposal(p.tree, p.tokens, flat)


def test_copies_verified_against_a_flat_row_fail_the_checker(monkeypatch):
    import multispec.decoding.sd

    monkeypatch.setattr(multispec.decoding.sd, "make_drafter", lambda *a, **k: _UniformRows(setup_of(a[1]), 1, 3))
    report = check_method("sd", runs=RUNS, pairs=2, vocab=3, n_tokens=4, seed=3, gamma=3)
    assert not report.passed


@pytest.mark.slow
def test_suffix_trees_without_the_fixed_mask_fail_the_checker(monkeypatch):
    import multispec.drafting.copying as drafters

    real = drafters.fixed_proposal

    def unmasked(s, copy):
        p = real(s, copy)
        return Proposal(p.tree, p.tokens, p.draft_probs, p.live, None)

    monkeypatch.setattr(drafters, "fixed_proposal", unmasked)
    # five tokens over three: suffixes with several continuations are common (with two tokens the mistake
    # is harmless: after one is rejected the residual is one-hot on the other)
    report = check_method(
        "batch-sd", runs=RUNS, pairs=2, vocab=3, n_tokens=5, seed=3, drafts=3, gamma=2, drafter="suffix"
    )
    assert not report.passed
    monkeypatch.setattr(drafters, "fixed_proposal", real)
    assert check_method(
        "batch-sd", runs=RUNS, pairs=2, vocab=3, n_tokens=5, seed=3, drafts=3, gamma=2, drafter="suffix"
    ).passed


@pytest.fixture
def markov_costs():
    """A fixed cost curve for the toy models, so that `gamma=auto` is deterministic in tests."""
    target, draft = random_markov_pair(3, 5, 0)
    keys = [cost_key(target), cost_key(draft)]
    saved = {k: _COSTS.get(k) for k in keys}
    _COSTS[keys[0]] = ForwardCost((1.0, 1.1, 1.2, 1.3, 1.4))
    _COSTS[keys[1]] = ForwardCost((0.05,))
    yield
    for k, v in saved.items():
        if v is None:
            _COSTS.pop(k, None)
        else:
            _COSTS[k] = v


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["hybrid", "lookup"])
def test_gamma_auto_passes_the_checker(markov_costs, drafter):
    report = check_method("sd", runs=RUNS, pairs=2, vocab=3, n_tokens=4, seed=3, gamma="auto", drafter=drafter)
    assert report.passed, report.pairs


# -- the controller ---------------------------------------------------------------------------------------


def _option(key, length, runner=None):
    return Option(key, length, runner, lambda g: None)


def _explored(controller, *keys):
    for key in keys:
        for _ in range(EXPLORE):
            controller.observe(key, 1, 0)
    return controller


def test_controller_does_not_draft_when_no_length_pays():
    steep = DraftLength(ForwardCost((1.0, 2.0, 3.0, 4.0)), None, max_gamma=3)
    assert steep.plan([_option("lookup:1", 3)], 100).length == 1  # first it tries the option
    plan = _explored(steep, "lookup:1").plan([_option("lookup:1", 3)], 100)
    assert plan.option is None and plan.length == 0 and plan.tokens == 1.0


def test_controller_tries_every_option_before_trusting_the_records():
    c = DraftLength(ForwardCost((1.0, 1.1, 1.2)), ForwardCost((0.3,)), max_gamma=2)
    draft = SimpleNamespace(committed=99)
    options = [_option("lookup:1", 2), _option("model", 2, runner=draft)]
    for _ in range(EXPLORE):
        assert c.plan(options, 100).option.key == "lookup:1"
        c.observe("lookup:1", 1, 0)
    for _ in range(EXPLORE):  # then the model, which costs draft forwards, gets its tries too
        assert c.plan(options, 100).option.key == "model"
        c.observe("model", 1, 1)
    assert c.plan(options, 100).option.key == "model"  # and wins on its record


def test_controller_drafts_long_when_acceptance_is_high_and_the_forward_flat():
    flat = DraftLength(ForwardCost((1.0, 1.05, 1.1, 1.15, 1.2)), None, max_gamma=4)
    for _ in range(50):
        flat.observe("lookup:3", 4, 4)
    plan = flat.plan([_option("lookup:3", 4)], 100)
    assert plan.length == 4 and plan.tokens > 4.5


def test_controller_prefers_the_option_with_the_better_record_and_counts_draft_forwards():
    c = DraftLength(ForwardCost((1.0, 1.1, 1.2)), ForwardCost((0.05,)), max_gamma=2)
    for _ in range(30):
        c.observe("model", 2, 2)
        c.observe("lookup:1", 2, 0)
    c.observe("lookup:1", 1, 0)
    draft = SimpleNamespace(committed=99)  # one token behind: the usual state after a verification
    plan = c.plan([_option("lookup:1", 2), _option("model", 2, runner=draft)], 100)
    assert plan.option.key == "model"
    assert plan.seconds == pytest.approx(1.2 + 2 * 0.05)
    # a draft that missed 3 tokens feeds them first: its first forward covers 3 tokens
    draft.committed = 97
    assert c.plan([_option("model", 2, runner=draft)], 100).seconds == pytest.approx(1.2 + 0.05 * 3 + 0.05)


def test_controller_prices_the_work_besides_forwards():
    # a copy accepted half the time: 1.5 tokens for 1.1 s of forwards pays against a plain step's 1 s, but not
    # once a drafting iteration's 0.6 s of verifying and committing is counted; it pays again where a plain
    # step's own work (0.3 s) is counted too
    def controller(overhead, plain):
        c = DraftLength(ForwardCost((1.0, 1.1)), None, max_gamma=1, overhead=overhead, plain_overhead=plain)
        for _ in range(200):
            c.observe("lookup:1", 1, 1)
            c.observe("lookup:1", 1, 0)
        return c

    plan = controller(0.0, 0.0).plan([_option("lookup:1", 1)], 100)
    assert plan.length == 1 and plan.seconds == pytest.approx(1.1)
    plan = controller(0.6, 0.0).plan([_option("lookup:1", 1)], 100)
    assert plan.option is None and plan.seconds == pytest.approx(1.0)
    plan = controller(0.6, 0.3).plan([_option("lookup:1", 1)], 100)
    assert plan.length == 1 and plan.seconds == pytest.approx(1.7)


def test_controller_rates_are_per_position_given_the_earlier_ones_passed():
    c = DraftLength(ForwardCost((1.0,)), None, max_gamma=3)
    c.observe("k", 3, 1)  # position 1 accepted, position 2 rejected, position 3 never reached
    assert c.tries["k"] == [1, 1, 0] and c.accepts["k"] == [1, 0, 0]


def test_forward_cost_is_measured_once_and_never_decreases(tiny_llama_model):
    cost = forward_cost(tiny_llama_model)
    assert forward_cost(tiny_llama_model) is cost
    for row in cost.seconds:
        assert all(b >= a for a, b in zip(row, row[1:], strict=False))
        assert cost(cost.tokens[-1] + 3) >= row[-1]


def test_forward_cost_interpolates_between_measured_token_counts():
    cost = ForwardCost((1.0, 2.0, 4.0), tokens=(1, 2, 6))
    assert cost(4) == pytest.approx(3.0) and cost(6) == 4.0
    assert cost(8) == pytest.approx(5.0)  # along the last segment: 0.5 s per token
    with pytest.raises(ValueError, match="one cost per measured token count"):
        ForwardCost((1.0, 2.0), tokens=(1, 2, 3))


def test_a_padded_models_cost_is_a_staircase_of_its_buckets():
    # a compiled step pads 17 new tokens to 32: it costs what the measured count of that bucket (24) cost, not
    # an interpolation between 16 and 24; past the padded range the curve interpolates again
    tokens = (1, 2, 3, 4, 5, 8, 16, 24, 48, 65)
    seconds = (1.0, 1.1, 1.3, 1.3, 1.6, 1.6, 2.0, 3.0, 5.0, 7.0)
    stepped, straight = ForwardCost(seconds, tokens=tokens, padded=64), ForwardCost(seconds, tokens=tokens)
    assert stepped(17) == 3.0 and straight(17) == pytest.approx(2.125)
    assert stepped(6) == stepped(7) == 1.6 and stepped(3) == 1.3 and stepped(16) == 2.0
    assert stepped(33) == stepped(64) == 5.0
    assert stepped(65) == 7.0 and stepped(66) == straight(66)
    assert stepped.scaled(2.0)(17) == 6.0


def test_a_bucket_whose_graph_ran_slower_than_a_larger_ones_is_routed_to_it():
    from multispec.models.cost import _routed, bucket_route

    # buckets 1, 2, 4, 8, 16 (counts 1, 2, 3-4, 5-8, 9-16) and one eager count past the padded range; the
    # bucket of 4 ran slower than the 8 and the 16 (two contexts, the counts of a bucket averaged)
    tokens = (1, 2, 3, 4, 5, 8, 16, 17)
    rows = [[1.0, 1.1, 1.9, 2.1, 1.3, 1.5, 1.6, 9.0], [1.2, 1.3, 2.3, 2.5, 1.6, 1.6, 1.9, 9.5]]
    route = bucket_route(rows, tokens, padded=16)
    assert route == {4: 8}  # only moved buckets; the 8 is the cheapest at least as large as the 4
    # every count costs its (routed) bucket's mean: 3-8 all run the 8's graph
    assert _routed(rows[0], tokens, 16, route) == pytest.approx([1.0, 1.1, 1.4, 1.4, 1.4, 1.4, 1.6, 9.0])
    # where costs rise with the bucket nothing moves
    assert bucket_route([[1.0, 1.1, 1.2, 1.2, 1.3, 1.3, 1.5, 9.0]], tokens, 16) == {}
    # nor where the larger bucket ran faster by less than the margin (timing noise)
    assert bucket_route([[1.0, 1.1, 1.2, 1.2, 1.17, 1.17, 1.5, 9.0]], tokens, 16) == {}


def test_a_compiled_models_curve_steps_by_its_buckets(tiny_llama_model):
    assert tiny_llama_model.padded_tokens == 0 and forward_cost(tiny_llama_model).padded == 0
    from tests.conftest import tiny_llama

    compiled = tiny_llama()
    compiled.compile = True
    assert compiled.padded_tokens == 64


def test_a_stored_compiled_curve_brings_its_bucket_route(tmp_path, monkeypatch):
    # a compiled model reading a curve another process measured (and priced with the 4-token bucket moved to
    # the 8) routes that bucket too; a curve stored without a route moves nothing
    import json

    from multispec.models.cost import COST_CONTEXTS, COST_TOKENS
    from tests.conftest import tiny_llama

    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    for route, want in (({"4": 8}, {4: 8}), (None, {})):
        model = tiny_llama(seed=7)
        model.compile = True
        key = cost_key(model)
        _COSTS.pop(key, None)
        entry = {
            "contexts": list(COST_CONTEXTS),
            "tokens": list(COST_TOKENS),
            "seconds": [[0.01] * len(COST_TOKENS)] * len(COST_CONTEXTS),
        }
        if route:
            entry["route"] = route
        (tmp_path / "forward_cost.json").write_text(json.dumps({key: entry}))
        cost = forward_cost(model)
        assert cost.padded == 64 and model.bucket_route == want
        _COSTS.pop(key, None)


def test_forward_cost_interpolates_between_contexts_and_extends_past_the_measured_lengths():
    cost = ForwardCost(((1.0, 2.0), (3.0, 5.0)), (100, 300))
    assert cost(1, 100) == 1.0 and cost(2, 300) == 5.0
    assert cost(2, 200) == pytest.approx(3.5)
    assert cost(2, 500) == pytest.approx(8.0)  # along the last segment
    assert cost(1, 10) == 1.0  # never below the shortest context's cost
    assert cost(4, 100) == pytest.approx(4.0)  # one more second per token, as from 1 to 2
    assert cost(0, 100) == 0.0


@pytest.fixture(scope="module")
def tiny_llama_model():
    from tests.conftest import tiny_llama

    return tiny_llama()


# -- the methods end to end --------------------------------------------------------------------------------


def test_copying_drafters_need_no_draft_model_and_model_drafting_says_it_does(tiny_llama_model):
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    for drafter in ("lookup", "suffix", "hybrid"):
        r = generate(tiny_llama_model, None, prompt, method="sd", drafter=drafter, temperature=0, max_new_tokens=12)
        ar = generate(tiny_llama_model, None, prompt, method="ar", temperature=0, max_new_tokens=12)
        assert r.token_ids == ar.token_ids and r.stats["draft_calls"] == 0
    with pytest.raises(ValueError, match="needs a draft model.*lookup"):
        generate(tiny_llama_model, None, prompt, method="sd", drafter="model")


def test_stats_report_the_accepted_length_histogram_and_position_acceptance(tiny_llama_model):
    prompt = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    r = generate(tiny_llama_model, tiny_llama_model, prompt, method="sd", gamma=3, temperature=0, max_new_tokens=20)
    st = r.stats
    hist = st["accepted_length_histogram"]
    assert sum(hist) == st["iterations"]
    assert sum(n * c for n, c in enumerate(hist)) == st["accepted"]
    assert st["position_acceptance"][0] == 1.0  # the target drafting for itself, greedy: all accepted


def test_bad_drafter_parameters_are_refused_before_any_model_runs():
    from multispec.decoding import get_method

    with pytest.raises(ValueError, match="drafter must be"):
        get_method("sd").resolve({"drafter": "ngram"})
    with pytest.raises(ValueError, match="min_ngram"):
        get_method("sd").resolve({"drafter": "lookup", "min_ngram": 4, "max_ngram": 2})
    with pytest.raises(ValueError, match="integer or 'auto'"):
        get_method("sd").resolve({"gamma": "sometimes"})
    assert get_method("sd").resolve({"gamma": "AUTO"})["gamma"] == "auto"


@pytest.mark.slow
def test_every_drafter_gives_greedy_ar_on_real_text(default_pair):
    # a summary copies from its article: the copying drafters find matches and have drafts rejected too
    target, draft = default_pair.target, default_pair.draft
    prompt = (
        "Summarise in two sentences: The city council met on Tuesday to discuss the new budget. The council "
        "approved funding for three new parks and a library renovation. Council members debated the cost "
        "of the library renovation for two hours before approving it."
    )
    ar = generate(target, None, prompt, method="ar", temperature=0, max_new_tokens=24).token_ids
    runs = [("sd", {"gamma": 4, "drafter": d}) for d in ("lookup", "suffix", "hybrid")]
    runs += [
        ("sd", {"gamma": "auto", "drafter": "hybrid"}),
        ("mcsd", {"k_config": "2x2x1", "drafter": "hybrid"}),
        ("batch-sd", {"drafts": 3, "gamma": 3, "drafter": "suffix"}),
        ("specinfer", {"k_config": "1x2x1", "drafter": "lookup"}),
    ]
    for method, params in runs:
        r = generate(target, draft, prompt, method=method, temperature=0, max_new_tokens=24, **params)
        assert r.token_ids == ar, (method, params)
        assert r.stats["accepted"] > 0 and r.stats["rejections"] > 0, (method, params)
