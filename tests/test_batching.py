"""Continuous batching (`multispec.batching`): a sequence decoded with others gets the tokens it gets alone, at
temperature 1 as at 0, whatever the others are and whenever they join; known-wrong batches (a random stream
shared by the rows, a verdict committed to another row's cache) fail the same check."""

import random
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from multispec import generate
from multispec.batching import Batcher, Cancelled
from multispec.models import static
from tests.conftest import tiny_llama

PROMPTS = [[3, 9, 27, 17], [5, 1, 44, 12, 60, 2, 8], [7, 7], [11, 40, 33, 2, 19, 50, 21, 4, 6, 31, 9], [30, 1, 2]]
METHODS = [
    "ar",
    "sd:gamma=3",
    "specinfer:k_config=2x1x1",
    "mcsd:k_config=2x2",
    "bild",
    "sd-opt:gamma=2",
    "batch-sd:drafts=3,gamma=2",
    "mtad:gamma=3,width=4",
    "mjsd:gamma=2,width=3",
]


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(seed=0), tiny_llama(seed=1)


def _run(batcher, prompts, method, temperature, stagger=0.0, seeds=None):
    """Every prompt's tokens, the generations started from threads at once (after a random stagger each)."""
    out, errors = {}, []
    rng = random.Random(7)
    delays = [rng.uniform(0, stagger) for _ in prompts]
    seeds = seeds or [100 + i for i in range(len(prompts))]

    def one(i):
        time.sleep(delays[i])
        try:
            got = batcher.generate(
                prompts[i], method, max_new_tokens=12, temperature=temperature, seed=seeds[i], score=False
            )
            out[i] = got.token_ids
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return [out[i] for i in range(len(prompts))]


def _alone(pair, method, temperature):
    batcher = Batcher(*pair, rows=1, capacity=256)
    try:
        return [_run(batcher, [p], method, temperature, seeds=[100 + i])[0] for i, p in enumerate(PROMPTS)]
    finally:
        batcher.close()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_sequence_gets_its_own_tokens_whatever_else_is_in_its_batch(pair, method, temperature):
    want = _alone(pair, method, temperature)
    # all at once in one batch, then in a batch too small for them (rows join as others leave), staggered
    for rows, stagger in ((len(PROMPTS), 0.0), (2, 0.05)):
        batcher = Batcher(*pair, rows=rows, capacity=256)
        try:
            assert _run(batcher, PROMPTS, method, temperature, stagger) == want
            assert batcher.stats["forwards"] > 0 and batcher.stats["rows"] > batcher.stats["forwards"]
        finally:
            batcher.close()


def test_greedy_tokens_in_a_batch_are_plain_generates(pair):
    target, draft = pair
    want = [generate(target, draft, p, "ar", max_new_tokens=12, temperature=0, score=False).token_ids for p in PROMPTS]
    batcher = Batcher(target, draft, rows=4, capacity=256)
    try:
        # fixed chains, and the draft lengths and trees that each row prices against the batch
        for method in ("sd:gamma=3", "sd:gamma=auto", "mcsd:tree=auto"):
            assert _run(batcher, PROMPTS, method, 0.0) == want, method
    finally:
        batcher.close()


def test_a_random_stream_shared_by_the_rows_changes_their_tokens(pair, monkeypatch):
    # known-wrong: one generator for every row, so a row's draws depend on the others' (its verdicts too)
    want = _alone(pair, "sd:gamma=3", 1.0)
    shared = torch.Generator().manual_seed(0)
    import multispec.api as api

    real = torch.Generator
    monkeypatch.setattr(api.torch, "Generator", lambda *a, **k: shared)
    try:
        batcher = Batcher(*pair, rows=len(PROMPTS), capacity=256)
        got = _run(batcher, PROMPTS, "sd:gamma=3", 1.0)
        batcher.close()
    finally:
        monkeypatch.setattr(api.torch, "Generator", real)
    assert got != want


@pytest.mark.parametrize("engine", ["threaded", "lockstep"])
def test_a_verdict_committed_to_another_rows_cache_changes_their_tokens(pair, monkeypatch, engine):
    # known-wrong: a row's verdict (its cache cut back to the entries it accepted) committed to its neighbour's row,
    # in a row of the threaded batch (`RowModel`) and in a lockstep row (`OnRow`)
    import multispec.batching as batching
    from multispec.batching import RowModel
    from multispec.lockstep import OnRow

    want = _alone(pair, "sd:gamma=3", 0.0)

    def crop(self, cache, length):
        views = getattr(self._batcher.caches.get(self._role), "views", {})
        other = views.get(self._row ^ 1) if cache is self._row_cache else None
        self._model.crop(cache if other is None else other, length)

    def crop_on_row(self, cache, length):
        views = getattr(cache, "batch", None) and cache.batch.views
        other = views.get(cache.row ^ 1) if views else None
        self._model.crop(other if other is not None and length else cache, length)

    if engine == "threaded":
        monkeypatch.setattr(batching, "runs_in_lockstep", lambda *args: None)
        monkeypatch.setattr(RowModel, "crop", crop)
    else:
        monkeypatch.setattr(OnRow, "crop", crop_on_row)
    batcher = Batcher(*pair, rows=len(PROMPTS) + 1, capacity=256)
    try:
        got = _run(batcher, PROMPTS, "sd:gamma=3", 0.0)
    finally:
        batcher.close()
    assert got != want


def test_a_method_of_several_rows_runs_beside_the_batch_while_the_rows_decode(pair):
    # beam search holds several cache rows: it runs on caches of its own, each of its forwards between two batched
    # ones, and gets the tokens it gets alone; a request that joins while it runs decodes in the meantime and ends
    # first (the known-wrong variant, the whole beam search run at once between two batched forwards, keeps the
    # other request waiting until the beam search ends)
    target, draft = pair
    beam = dict(max_new_tokens=100, temperature=0, score=False)
    want = generate(target, draft, PROMPTS[1], "beam:width=3", **beam).token_ids
    short = generate(target, draft, PROMPTS[0], "sd:gamma=3", max_new_tokens=4, temperature=0, score=False).token_ids
    batcher = Batcher(target, draft, rows=2, capacity=256)
    ended, got = [], {}

    def run(name, prompt, method, **kwargs):
        got[name] = batcher.generate(prompt, method, **kwargs).token_ids
        ended.append(name)

    try:
        beside = threading.Thread(target=run, args=("beam", PROMPTS[1], "beam:width=3"), kwargs=beam)
        beside.start()
        deadline = time.monotonic() + 60
        while batcher.stats["single"] < 3 and time.monotonic() < deadline:  # the beam search is under way
            time.sleep(0.001)
        # another beam search waits for it (one beside the batch at a time), and a cancelled one stops waiting
        cancel = threading.Event()
        cancel.set()
        with pytest.raises(Cancelled, match="beside the batch"):
            batcher.generate(PROMPTS[2], "beam:width=2", max_new_tokens=4, temperature=0, score=False, cancel=cancel)
        run("sd", PROMPTS[0], "sd:gamma=3", max_new_tokens=4, temperature=0, score=False)
        beside.join(120)
        assert got == {"beam": want, "sd": short}
        assert ended == ["sd", "beam"]
        assert batcher.stats["beside"] == 1 and batcher.stats["forwards"] > 0 and batcher.stats["stalls"] > 0
    finally:
        batcher.close()


LONG = [[(5 * i + 7 * j) % 60 + 1 for j in range(n)] for i, n in enumerate((37, 3, 22, 9, 30))]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_long_prompts_are_fed_in_chunks_beside_the_decoding_rows(pair, monkeypatch, temperature):
    # small chunks, so that every prompt but one takes several forwards, each shared with rows that decode; a
    # row's tokens are those it gets in a batch of its own (fed in the same chunks), and greedy ones are `ar`'s
    import multispec.batching as batching

    monkeypatch.setattr(batching, "PREFILL_CHUNK", 4)
    monkeypatch.setattr(batching, "PREFILL_TOKENS", 8)
    monkeypatch.setattr(batching, "runs_in_lockstep", lambda *args: None)  # the threaded rows' chunks (lockstep's:
    method = "sd:gamma=3"  # tests/test_lockstep.py)
    alone = Batcher(*pair, rows=1, capacity=256)
    try:
        want = [_run(alone, [p], method, temperature, seeds=[100 + i])[0] for i, p in enumerate(LONG)]
    finally:
        alone.close()
    batcher = Batcher(*pair, rows=3, capacity=256)
    try:
        assert _run(batcher, LONG, method, temperature, stagger=0.05) == want
        assert batcher.stats["stalls"] == 0  # no prompt ran alone
        assert batcher.stats["prefill_chunks"] >= 2 * sum(-(-len(p) // 4) for p in LONG)  # both models' prompts
        assert batcher.stats["prefill_shared"] > 0
    finally:
        batcher.close()
    if temperature == 0.0:
        target, draft = pair
        assert want == [
            generate(target, draft, p, "ar", max_new_tokens=12, temperature=0, score=False).token_ids for p in LONG
        ]


def test_bad_batches_are_refused_and_a_request_longer_than_a_row_runs_beside(pair):
    with pytest.raises(ValueError, match="rows must be an integer >= 1"):
        Batcher(*pair, rows=0)
    with pytest.raises(ValueError, match="capacity must be an integer >= 1"):
        Batcher(*pair, rows=2, capacity=2.5)
    target, draft = pair
    prompt = list(range(1, 15))
    want = generate(target, draft, prompt, "sd:gamma=3", max_new_tokens=8, temperature=0, score=False).token_ids
    batcher = Batcher(*pair, rows=1, capacity=16)
    try:
        got = batcher.generate(prompt, "sd:gamma=3", max_new_tokens=8, temperature=0, score=False)
        assert got.token_ids == want and batcher.stats["beside"] == 1 and batcher.stats["forwards"] == 0
    finally:
        batcher.close()
    # a row holds the prompt, the output and the method's largest iteration: a tree of 200 nodes (or a draft's
    # beam tree of 16 x 8) whose last iteration would not fit runs beside the batch, and batches where it fits
    for method in ("mcsd:k_config=8x8x2", "mtad:gamma=8,width=16"):
        want = generate(target, draft, prompt, method, max_new_tokens=24, temperature=0, score=False).token_ids
        for capacity, batched in ((150, False), (300, True)):
            batcher = Batcher(*pair, rows=2, capacity=capacity)
            try:
                got = batcher.generate(prompt, method, max_new_tokens=24, temperature=0, score=False)
                assert got.token_ids == want and (batcher.stats["forwards"] > 0) == batched, (method, capacity)
            finally:
                batcher.close()


def _row_logits(model, prompts, rows_together: int, prompt_beside: bool = False):
    """Row 0's logits for a one-token step, after each prompt was fed into its own row, scored in one
    batched forward with the first `rows_together` rows (and, `prompt_beside`, a 20-token prompt fed into the
    next row in the same forward)."""
    cache = model.new_batch_cache(len(prompts) + 1, 256)
    views = [static.RowKV(cache, r) for r in range(len(prompts) + 1)]
    for view, prompt in zip(views, prompts, strict=False):
        model.forward(view, torch.tensor([prompt]))
    feeds = [(r, views[r], torch.tensor([9 + r]), None, None, 0) for r in range(rows_together)]
    if prompt_beside:
        row = len(prompts)
        feeds.append((row, views[row], torch.arange(1, 21), None, None, 1, 19))
    return model.forward_rows(cache, feeds)[0]


def test_a_rows_logits_in_bfloat16_do_not_depend_on_the_other_rows(monkeypatch):
    # the bits themselves: row 0 scored alone and with three other rows of other lengths; the known-wrong variant
    # (steps not padded to `batch_rows`, so the products' kernels change with the row count) must differ
    from tests.models.helpers import _bf16_llama

    model = _bf16_llama()
    prompts = [PROMPTS[3] * 3, PROMPTS[0], PROMPTS[1] * 2, PROMPTS[4]]
    alone = _row_logits(model, prompts, 1)
    assert torch.equal(alone, _row_logits(model, prompts, 4))
    assert torch.equal(alone, _row_logits(model, prompts, 2, prompt_beside=True))  # a prompt's chunk packed beside
    monkeypatch.setattr(type(model), "batch_rows", property(lambda self: 1))
    if torch.equal(_row_logits(model, prompts, 1), _row_logits(model, prompts, 4)):
        pytest.skip(
            "this machine's bfloat16 products give the same bits for any row count: the wrong variant shows nothing"
        )


# -- the batch's draft length (`RowLoad`) ----------------------------------------------------------------------


def _batch_of(rows: int, chosen: tuple[int, float, int] = (1, 1.0, 0), draft_step: float = 0.002):
    """A stand-in batch of `rows` active rows, the others having chosen `chosen` (tokens fed, expected tokens,
    draft positions), priced by a compute-bound curve (a batched step of n tokens costs 0.1 + 0.01 n seconds; a
    draft step over the rows 0.01 + `draft_step` n)."""
    from multispec.batching import RowLoad
    from multispec.models.cost import ForwardCost

    tokens = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    curves = {
        "target": ForwardCost((tuple(0.1 + 0.01 * n for n in tokens),), tokens=tokens),
        "draft": ForwardCost((tuple(0.01 + draft_step * n for n in tokens),), tokens=tokens),
    }
    model = SimpleNamespace(batch_entries=lambda n: n)  # no padding
    batch = SimpleNamespace(
        _active=set(range(rows)),
        _chosen=dict.fromkeys(range(1, rows), chosen),
        _pooled={},
        _exploring={},
        models={"target": model, "draft": model},
        entries=lambda role, rows, width: rows * width,
        scale={"target": 1.0, "draft": 1.0},
        gap=0.0,
        curve=curves.__getitem__,
        caches={"target": None, "draft": None},  # both models decode in batched forwards
    )
    return RowLoad(batch, 0)


def _chosen_length(load, target=None, draft=None, decaying: bool = False) -> int:
    """The draft length `gamma=auto` chooses for row 0 with a record of four of six drafts accepted each time
    (`decaying`: 0 to 6 of them in turn, so the acceptance falls position by position)."""
    from multispec.drafting.base import Option
    from multispec.drafting.length import EXPLORE, DraftLength
    from multispec.models.cost import ForwardCost

    c = DraftLength(target or ForwardCost((1.0,)), draft or ForwardCost((1.0,)), max_gamma=6, load=load)
    for i in range(EXPLORE + 42):
        c.observe("model", 6, i % 7 if decaying else 4)
    return c.plan([Option("model", 6, SimpleNamespace(committed=99), lambda g: None)], 100).length


def test_drafting_shrinks_as_the_batch_fills_down_to_none():
    lengths = [_chosen_length(_batch_of(rows)) for rows in (2, 4, 16, 64)]
    assert lengths[0] >= 3, lengths  # with one other row, a wide chain is nearly free
    assert lengths == sorted(lengths, reverse=True) and lengths[-1] == 0, lengths


def test_a_row_pays_its_share_of_the_draft_forwards_it_joins(monkeypatch):
    # the target waits for the longest chain any row drafts: a position a neighbour drafts too costs this row half
    # that draft forward, so with costly draft steps it drafts longer beside a neighbour that drafts five than
    # apart; but not as long as if those positions were free (priced free, rows kept drafting once one did)
    from multispec.batching import RowLoad

    costly = dict(draft_step=0.01)
    apart = _chosen_length(_batch_of(2, (1, 1.0, 0), **costly), decaying=True)
    beside = _chosen_length(_batch_of(2, (6, 3.0, 5), **costly), decaying=True)
    monkeypatch.setattr(RowLoad, "rows_drafting", lambda self: 10**9)  # a share of nothing: free
    free = _chosen_length(_batch_of(2, (6, 3.0, 5), **costly), decaying=True)
    assert apart < beside < free and free >= 5, (apart, beside, free)
    monkeypatch.undo()
    load = _batch_of(2)
    _chosen_length(load)
    assert load._batcher._chosen[0][2] == load._batcher._chosen[0][0] - 1 >= 3  # told to the batch


def test_a_lone_row_prices_its_drafts_as_one_sequence():
    # alone in the batch, a row chooses what `generate` alone chooses (the single-sequence curves); with another
    # row, the batch's prices (here a large gap between forwards) apply
    from multispec.models.cost import ForwardCost

    tokens = (1, 2, 4, 8, 16)
    flat = [ForwardCost(((seconds,) * len(tokens),), tokens=tokens) for seconds in (1.0, 0.05)]
    alone, pair = _batch_of(1), _batch_of(2)
    alone._batcher.gap = pair._batcher.gap = 0.5
    assert _chosen_length(alone, target=flat[0], draft=flat[1]) == _chosen_length(None, target=flat[0], draft=flat[1])
    assert _chosen_length(None, target=flat[0], draft=flat[1]) >= 3
    assert _chosen_length(pair, target=flat[0], draft=flat[1]) < _chosen_length(None, target=flat[0], draft=flat[1])


def test_a_joining_row_starts_from_the_batchs_pooled_record():
    load = _batch_of(2)
    for _ in range(100):
        load.record("model", 3, 2)  # first two positions accepted, the third not
    tries, accepts = load.pooled(4)["model"]
    assert tries == pytest.approx([12.0, 12.0, 12.0, 0.0]) and accepts == pytest.approx([12.0, 12.0, 0.0, 0.0])
    from multispec.drafting.length import DraftLength
    from multispec.models.cost import ForwardCost

    joining = DraftLength(ForwardCost((1.0,)), None, max_gamma=4, load=load)
    assert joining.rates("model")[:3] == pytest.approx([13 / 15, 13 / 15, 1 / 15])


def test_rows_starting_together_share_the_trying_of_a_drafter():
    # a row tries the draft model with one draft only while the batch holds fewer than EXPLORE tries of it, those
    # under way counted: rows that start together do not each feed the draft their whole prompt; the others price
    # it by the batch's record once there is one
    from multispec.batching import RowLoad
    from multispec.drafting.base import Option
    from multispec.drafting.length import EXPLORE, DraftLength
    from multispec.models.cost import ForwardCost

    batch = _batch_of(8)._batcher
    options = [Option("model", 6, SimpleNamespace(committed=0), lambda g: None)]
    cost = ForwardCost((1.0,))
    rows = [DraftLength(cost, cost, max_gamma=6, load=RowLoad(batch, r)) for r in range(8)]
    plans = [row.plan(options, 100) for row in rows]
    trying = [r for r, plan in enumerate(plans) if plan.option is not None]
    assert trying == list(range(EXPLORE)) and all(plans[r].length == 1 for r in trying)
    assert batch._exploring["model"] == set(trying)
    for r in trying:  # their verdicts: the draft accepted each time
        rows[r].observe("model", 1, 1)
    assert batch._exploring["model"] == set() and RowLoad(batch, 7).tried("model") == EXPLORE
    assert rows[7].rates("model")[0] == pytest.approx((EXPLORE + 1) / (EXPLORE + 3))  # the batch's record
    assert not rows[7]._explores("model", RowLoad(batch, 7))  # it makes no try of its own


def test_the_batch_prices_what_the_other_rows_commit():
    # the other rows' expected tokens are part of the choice: rows that commit many make this row's extra
    # tokens a small share of the batch's, so a costlier forward pays less
    assert _batch_of(8).others(3) == [7.0, 7.0, 7.0, 7.0]
    assert _batch_of(8, (3, 2.5, 2)).others(2) == pytest.approx([17.5, 17.5, 17.5])
    assert _chosen_length(_batch_of(4, (1, 1.0, 0))) >= _chosen_length(_batch_of(4, (2, 8.0, 1)))


def _chosen_tree(load, target=None, draft=None):
    """The tree `tree=auto` chooses for row 0 (nodes, levels) with a record of a draft accepted 70 % of the time at
    rank 0 and 20 % at rank 1, at every depth."""
    from multispec.drafting.shape import AutoTree
    from multispec.models.cost import ForwardCost
    from multispec.tree_search import RankAcceptance

    ranks = RankAcceptance()
    for i in range(200):
        for depth in range(1, 7):
            ranks.record(depth, 0, i % 10 < 7)
            ranks.record(depth, 1, i % 10 < 2)
    auto = AutoTree(
        None,
        lambda: ranks,
        target or ForwardCost((1.0,)),
        draft or ForwardCost((1.0,)),
        lambda: (0.0, 0.0),
        lambda context: 1,
        max_nodes=16,
        max_depth=6,
        overhead=(0.0, 0.0, 0.0),
        load=load,
    )
    auto.search(100, 1, 6)
    return auto.choice.nodes, len(auto.choice.widths)


def test_automatic_trees_shrink_as_the_batch_fills_down_to_none():
    # tree=auto in a batch prices a tree as the batch's packed forward with the other rows' tokens, for the
    # tokens the whole batch commits: more rows, smaller trees, then none
    nodes = [_chosen_tree(_batch_of(rows))[0] for rows in (2, 4, 16, 64)]
    assert nodes == sorted(nodes, reverse=True) and nodes[0] >= 2 and nodes[-1] == 0, nodes
    # the batch's choice is told to the others' prices: the tokens fed, the tokens expected, the draft levels
    load = _batch_of(2)
    fed, levels = _chosen_tree(load)
    assert load._batcher._chosen[0][0] == 1 + fed and load._batcher._chosen[0][2] == levels


def test_a_lone_row_searches_its_tree_as_one_sequence():
    # the only row of a batch prices as `generate` does (its own curves), not from the batched step's
    from multispec.models.cost import ForwardCost

    tokens = tuple(range(1, 65))
    flat = ForwardCost((tuple(1.0 + 0.001 * n for n in tokens),), tokens=tokens), ForwardCost((0.05,))
    alone = _chosen_tree(_batch_of(1), *flat)
    assert alone == _chosen_tree(None, *flat) and alone[0] >= 4
    assert _chosen_tree(_batch_of(8), *flat)[0] < alone[0]


def test_a_shallow_tree_waits_for_the_other_rows_drafts():
    # another row drafting six levels runs six draft forwards whatever this row proposes: with costly draft
    # steps, this row drafts deeper beside it than beside rows that do not draft
    costly = {"draft_step": 0.01}
    apart = _chosen_tree(_batch_of(2, (1, 1.0, 0), **costly))
    beside = _chosen_tree(_batch_of(2, (7, 3.0, 6), **costly))
    assert beside[1] > apart[1], (apart, beside)


# -- the law of a batch's rows, on the exact test models ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, params",
    [("sd", {"gamma": "auto", "drafter": "hybrid"}), ("mcsd", {"k_config": "2x2"}), ("batch-sd", {"drafts": 2})],
)
def test_rows_of_a_batch_follow_the_target_law(method, params, monkeypatch):
    from multispec import batching
    from multispec.tools.check import check_method

    monkeypatch.setattr(batching, "runs_in_lockstep", lambda *args: None)  # the threaded batch (the server's)

    report = check_method(method, runs=2000, pairs=1, vocab=4, n_tokens=3, seed=3, batch=8, **params)
    assert report.passed, report.pairs


@pytest.mark.slow
def test_rows_sharing_one_random_stream_fail_the_law(monkeypatch):
    # known-wrong: every row of a batch draws from the same stream (the same seed), so the rows' outputs are one
    # sample repeated, not independent ones; the same check must reject it
    from multispec.tools.check import check_method

    original = Batcher.generate

    def shared(self, prompt, method=None, **kwargs):
        kwargs["seed"] = kwargs["seed"] - kwargs["seed"] % 8
        return original(self, prompt, method, **kwargs)

    monkeypatch.setattr(Batcher, "generate", shared)
    # (a confidence stop keeps `sd` in the threaded batch: plain chains run in lockstep)
    report = check_method("sd", runs=2000, pairs=1, vocab=4, n_tokens=3, seed=3, batch=8, gamma=2, confidence=0.2)
    assert not report.passed, report.pairs


def test_generate_batch_gives_each_prompt_the_output_generate_gives_it(pair):
    from multispec import generate_batch

    got = generate_batch(*pair, PROMPTS, "sd:gamma=3", max_new_tokens=8, temperature=1.0, seed=40, score=False)
    want = [
        generate(*pair, p, "sd:gamma=3", max_new_tokens=8, temperature=1.0, seed=40 + i, score=False).token_ids
        for i, p in enumerate(PROMPTS)
    ]
    assert [r.token_ids for r in got] == want
    for r in got:  # each row's time split: its share of the forwards it ran in, within its forward calls' time
        assert 0 < r.stats["batch_target_share_seconds"] <= r.stats["target_seconds"] + 1e-6
        assert 0 < r.stats["batch_draft_share_seconds"] <= r.stats["draft_seconds"] + 1e-6
        assert r.stats["batch_waiting_seconds"] >= 0
    greedy = generate_batch(*pair, PROMPTS, "sd:gamma=auto,drafter=hybrid", max_new_tokens=8, temperature=0)
    assert [r.token_ids for r in greedy] == [
        generate(*pair, p, "ar", max_new_tokens=8, temperature=0, score=False).token_ids for p in PROMPTS
    ]
    with pytest.raises(ValueError, match="non-empty list"):
        generate_batch(*pair, [], "ar")
    with pytest.raises(ValueError, match="rows must be"):
        generate_batch(*pair, PROMPTS, "ar", rows=0)


def test_a_reduced_draft_vocabulary_runs_its_rows_together_on_the_cut_head(pair, monkeypatch):
    from multispec import generate_batch
    from multispec.models.vocab import top_ids

    target, draft = pair
    monkeypatch.setattr(draft, "token_counts", torch.bincount(torch.arange(64) % 40, minlength=64))
    cut = draft.with_head_rows(top_ids(draft.token_counts, 16, draft.stop_tokens))  # the one `draft_vocab` makes
    fed, original = [], cut.forward_rows
    monkeypatch.setattr(cut, "forward_rows", lambda cache, feeds: fed.append(len(feeds)) or original(cache, feeds))
    method = "sd:gamma=3,draft_vocab=16"
    got = generate_batch(target, draft, PROMPTS, method, max_new_tokens=8, temperature=1.0, seed=40, score=False)
    want = [
        generate(target, draft, p, method, max_new_tokens=8, temperature=1.0, seed=40 + i, score=False).token_ids
        for i, p in enumerate(PROMPTS)
    ]
    assert [r.token_ids for r in got] == want
    assert fed and max(fed) > 1  # the rows' draft steps ran in one forward on the cut head


def test_requests_of_mixed_methods_and_warps_arriving_one_by_one_get_generates_tokens(pair):
    # the server's path: requests arrive one by one, each with its own method and warp; chains decode in the
    # batch's lockstep rows, a tree in a threaded row beside them, on the same caches; each gets the tokens
    # `generate` gives it alone with its seed (greedy for `gamma=auto`, whose choices read the batch's prices)
    asks = [
        (PROMPTS[0], "ar", {"temperature": 1.0}),
        (PROMPTS[1], "sd:gamma=3", {"temperature": 0.7, "top_p": 0.9}),
        (PROMPTS[2], "sd:gamma=2,drafter=lookup", {"temperature": 1.0, "top_k": 20}),
        (PROMPTS[3], None, {"temperature": 0.0}),
        (PROMPTS[4], "mcsd:k_config=2x1", {"temperature": 1.0}),
        (PROMPTS[1] * 3, "sd:gamma=1", {"temperature": 1.0}),
        (PROMPTS[0] * 2, "sd:gamma=auto,drafter=suffix", {"temperature": 0.0}),
    ]
    kwargs = {"max_new_tokens": 12, "score": False}
    want = [generate(*pair, p, m, seed=50 + i, **kwargs, **w).token_ids for i, (p, m, w) in enumerate(asks)]
    batcher = Batcher(*pair, rows=4, capacity=256)
    got, errors = {}, []
    delays = random.Random(3).choices([0.0, 0.02, 0.05, 0.1], k=len(asks))

    def one(i):
        time.sleep(delays[i])
        prompt, method, warp = asks[i]
        try:
            got[i] = batcher.generate(prompt, method, seed=50 + i, **kwargs, **warp).token_ids
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(asks))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert [got[i] for i in range(len(asks))] == want
        assert (
            batcher._lockstep.stats["forwards"] > 0 and batcher.stats["forwards"] > batcher._lockstep.stats["forwards"]
        )
    finally:
        batcher.close()


def test_a_request_cancelled_while_it_waits_for_a_lockstep_row_leaves_the_queue(pair):
    batcher = Batcher(*pair, rows=1, capacity=256)
    cancel = threading.Event()
    try:
        # the first request holds the only row: its first piece of output waits (on the batch's thread) until
        # the test lets it go
        release = threading.Event()
        first = threading.Thread(
            target=batcher.generate,
            args=(PROMPTS[0], "ar"),
            kwargs={"max_new_tokens": 8, "score": False, "on_tokens": lambda tokens: not release.wait(60)},
        )
        first.start()
        deadline = time.monotonic() + 60
        while not batcher.active_rows and time.monotonic() < deadline:
            time.sleep(0.001)
        threading.Timer(0.2, cancel.set).start()
        with pytest.raises(Cancelled, match="waiting for a row"):
            batcher.generate(PROMPTS[1], "ar", max_new_tokens=4, cancel=cancel)
        assert not batcher._asks and batcher.active_rows == 1
        release.set()
        first.join(120)
        assert not batcher.active_rows
    finally:
        batcher.close()


@pytest.mark.slow
@pytest.mark.parametrize("wrong", [False, True])
def test_requests_arriving_one_by_one_among_other_methods_follow_the_target_law(monkeypatch, wrong):
    # the checker's test on the server's path: `sd:gamma=2` and default-method requests (T = 1) arrive at random
    # times into a batch of 4 rows where `ar` requests of other prompts, lengths and warps decode too; the counted
    # outputs follow the exact law. Known-wrong: after a rejection the next token drawn from the target's row, not
    # the residual, fails the same test
    import numpy as np

    from multispec import lockstep
    from multispec.models.markov import random_markov_pair
    from multispec.tools.check import chi_square

    if wrong:
        monkeypatch.setattr(lockstep, "RESIDUAL_EPS", float("inf"))
    vocab, n = 4, 3
    target, draft = random_markov_pair(vocab, n + 1, seed=5)
    exact = target.sequence_distribution([1], n)[1].numpy()
    runs = 1200
    asks = []
    for i in range(2 * runs):
        asks.append(("counted", "sd:gamma=2" if i % 2 else None, [1], n, {"temperature": 1.0}))
        if i % 3 == 0:
            asks.append(("other", "ar", [i % vocab], 1 + i % n, {"temperature": 0.7, "top_k": 3}))
    rng = random.Random(11)
    delays = [rng.choice([0.0, 0.0, 0.0005, 0.002]) for _ in asks]
    counts = {None: np.zeros(vocab**n, dtype=np.int64), "sd:gamma=2": np.zeros(vocab**n, dtype=np.int64)}
    weights = vocab ** np.arange(n - 1, -1, -1)
    lock, errors = threading.Lock(), []
    batcher = Batcher(target, draft, rows=4, capacity=16)

    def client(k):
        for j in range(k, len(asks), 8):
            time.sleep(delays[j])
            kind, method, prompt, tokens, warp = asks[j]
            try:
                out = batcher.generate(prompt, method, max_new_tokens=tokens, seed=1000 + j, score=False, **warp)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return
            if kind == "counted":
                with lock:
                    counts[method][int(np.dot(out.token_ids, weights))] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    finally:
        batcher.close()
    assert not errors, errors
    assert batcher._lockstep.stats["forwards"] > 0
    p_values = [chi_square(c, exact)[2] for c in counts.values()]
    assert all(c.sum() == runs for c in counts.values())
    if wrong:
        assert min(p_values) < 1e-3, p_values
    else:
        assert min(p_values) > 1e-3, p_values


def test_a_requests_failing_callback_ends_its_own_row_only(pair):
    # in lockstep every row's `on_tokens` runs on the batch's thread: one that raises fails its own request (as
    # `generate` raises it), while the row beside it decodes on to `generate`'s tokens
    want = generate(*pair, PROMPTS[1], "sd:gamma=2", max_new_tokens=12, temperature=1.0, seed=8, score=False)
    batcher = Batcher(*pair, rows=2, capacity=256)
    got, errors = {}, []

    def broken(tokens):
        raise KeyError("the caller's own bug")

    def one(name, prompt, **kwargs):
        try:
            got[name] = batcher.generate(prompt, "sd:gamma=2", max_new_tokens=12, score=False, **kwargs).token_ids
        except KeyError as e:
            errors.append(e)

    threads = [
        threading.Thread(target=one, args=("broken", PROMPTS[0]), kwargs={"on_tokens": broken}),
        threading.Thread(target=one, args=("fine", PROMPTS[1]), kwargs={"temperature": 1.0, "seed": 8}),
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(errors) == 1 and "the caller's own bug" in str(errors[0])
        assert got == {"fine": want.token_ids} and not batcher.active_rows
    finally:
        batcher.close()
