"""Lockstep batches (`multispec.lockstep`): `ar` and `sd` chains decoded for many rows at once, the rows' drawing,
verification and commits done together. With a fixed chain (of the draft model or copied) each row gets the tokens
`generate` gives it alone with its seed, at any temperature, whatever else runs and whenever it joins; with
`gamma=auto`, alone in the batch; known-wrong batches (a uniform shared by the rows, a verdict committed to the
neighbour's cache) fail the same checks."""

import random

import pytest

from multispec import generate, generate_batch
from multispec.batching import Batcher
from multispec.lockstep import OnRow
from tests.conftest import tiny_llama
from tests.test_batching import PROMPTS

LONG = list(range(1, 60)) * 2 + [5, 9]  # 120 tokens: fed in two chunks while the other rows decode


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(seed=0), tiny_llama(seed=1)


@pytest.fixture
def lockstep_only(monkeypatch):
    """Fail if a generation leaves the lockstep path for the threaded batch."""

    def threaded(*args, **kwargs):
        raise AssertionError("ran in the threaded batch, not in lockstep")

    monkeypatch.setattr(Batcher, "generate", threaded)


def _alone(pair, prompts, method, seed=40, **kwargs):
    return [
        generate(*pair, p, method, max_new_tokens=12, seed=seed + i, score=False, **kwargs).token_ids
        for i, p in enumerate(prompts)
    ]


@pytest.mark.parametrize(
    "method", ["ar", "sd:gamma=1", "sd:gamma=3", "sd:gamma=2,drafter=lookup", "sd:gamma=3,drafter=hybrid"]
)
@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 0.8, "top_p": 0.9}])
def test_each_row_gets_the_tokens_generate_gives_it_alone(pair, lockstep_only, method, sampling):
    prompts = [*PROMPTS, LONG]
    want = _alone(pair, prompts, method, **sampling)
    for rows in (len(prompts), 2):  # all at once; and joining as others leave, the long prompt beside decoding rows
        got = generate_batch(*pair, prompts, method, max_new_tokens=12, seed=40, rows=rows, score=False, **sampling)
        assert [r.token_ids for r in got] == want, rows
    stats = got[0].stats
    assert stats["new_tokens"] == 12 and stats["target_calls"] >= 1
    assert 0 < stats["batch_target_share_seconds"] <= stats["target_seconds"] + 1e-9


def test_a_long_prompt_joins_in_chunks_beside_the_decoding_rows(pair, monkeypatch):
    from multispec import lockstep

    forwards = []
    real = lockstep.Lockstep._forward

    def spy(self, role, steps):
        forwards.append((role, [step.tokens.shape[-1] for _, _, step in steps]))
        return real(self, role, steps)

    monkeypatch.setattr(lockstep.Lockstep, "_forward", spy)
    monkeypatch.setattr(lockstep, "PREFILL_TOKENS", 100)  # LONG's 119 tokens do not fit one piece
    got = generate_batch(*pair, [PROMPTS[0], LONG], "sd:gamma=2", max_new_tokens=12, seed=40, score=False)
    assert [r.token_ids for r in got] == _alone(pair, [PROMPTS[0], LONG], "sd:gamma=2")
    # the long prompt's first 119 tokens in chunks at multiples of 64, each in a target forward with the short
    # row's decoding step (its pending token and two drafts)
    target = [sizes for role, sizes in forwards if role == "target"]
    assert [3, 64] in target and [3, 55] in target, target
    assert max(max(sizes) for sizes in target) <= lockstep.PREFILL_CHUNK


def test_greedy_rows_in_bfloat16_do_not_depend_on_the_batch_or_their_arrival(lockstep_only):
    # the default dtype and engine on this machine: 20 prompts of 1 to 150 tokens decoded alone (`generate`), then
    # in batches of random sizes in random orders (rows join as others leave), give identical tokens
    from tests.models.helpers import _bf16_llama

    target, draft = _bf16_llama(), _bf16_llama(hidden=192)
    rng = random.Random(5)
    prompts = [[rng.randrange(256) for _ in range(rng.choice([1, 3, 17, 70, 150]))] for _ in range(20)]
    kwargs = {"max_new_tokens": 10, "temperature": 0, "score": False}
    for method in ("ar", "sd:gamma=3", None):  # None: the default, `gamma=auto` with copies and the draft model
        want = [generate(target, draft, p, method, **kwargs).token_ids for p in prompts]
        for rows in (20, 3):
            order = rng.sample(range(20), 20)
            got = generate_batch(target, draft, [prompts[i] for i in order], method, rows=rows, **kwargs)
            assert [got[order.index(i)].token_ids for i in range(20)] == want, (method, rows)


def test_a_long_prompts_rows_in_bfloat16_do_not_depend_on_the_batch(lockstep_only, monkeypatch):
    # a prompt too long for one piece joins in chunks at fixed offsets: alone in a batch or beside others, the
    # same tokens
    from multispec import lockstep
    from tests.models.helpers import _bf16_llama

    monkeypatch.setattr(lockstep, "PREFILL_TOKENS", 100)
    target, draft = _bf16_llama(), _bf16_llama(hidden=192)
    rng = random.Random(6)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (150, 3, 130, 40, 101)]
    kwargs = {"max_new_tokens": 10, "temperature": 0, "score": False}
    want = [generate_batch(target, draft, [p], "sd:gamma=3", **kwargs)[0].token_ids for p in prompts]
    got = generate_batch(target, draft, prompts, "sd:gamma=3", rows=3, **kwargs)
    assert [r.token_ids for r in got] == want


def test_a_uniform_shared_by_the_rows_changes_their_tokens(pair, monkeypatch):
    # known-wrong: every row draws with the first row's generator, so a row's draws depend on the rows beside it
    from multispec import lockstep

    real = lockstep.categorical_each
    monkeypatch.setattr(
        lockstep, "categorical_each", lambda probs, generators: real(probs, [generators[0]] * len(generators))
    )
    got = generate_batch(*pair, PROMPTS, "sd:gamma=3", max_new_tokens=12, seed=40, temperature=1.0, score=False)
    assert [r.token_ids for r in got] != _alone(pair, PROMPTS, "sd:gamma=3", temperature=1.0)


def test_a_verdict_committed_to_another_rows_cache_changes_their_tokens(pair, monkeypatch):
    # known-wrong: a row's verdict (its cache cut back to the entries it accepted) cuts its neighbour's row
    def crop(self, cache, length):
        views = getattr(cache, "batch", None) and cache.batch.views
        other = views.get(cache.row ^ 1) if views else None
        self._model.crop(other if other is not None and length else cache, length)

    monkeypatch.setattr(OnRow, "crop", crop)
    got = generate_batch(*pair, PROMPTS, "sd:gamma=3", max_new_tokens=12, seed=40, temperature=0.0, score=False)
    assert [r.token_ids for r in got] != _alone(pair, PROMPTS, "sd:gamma=3", temperature=0.0)


def test_scored_outputs_and_streamed_pieces_match_generate(pair):
    pieces = []
    got = generate_batch(*pair, PROMPTS[:2], "sd:gamma=2", max_new_tokens=6, seed=3, on_tokens=pieces.append)
    for i, r in enumerate(got):
        alone = generate(*pair, PROMPTS[i], "sd:gamma=2", max_new_tokens=6, seed=3 + i)
        assert r.token_ids == alone.token_ids
        assert r.stats["mean_logprob"] == pytest.approx(alone.stats["mean_logprob"], abs=1e-5)
    assert sorted(t for p in pieces for t in p) == sorted(t for r in got for t in r.token_ids)


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, params", [("sd", {"gamma": 2}), ("ar", {}), ("sd", {"gamma": "auto", "drafter": "hybrid"})]
)
def test_lockstep_rows_follow_the_target_law(method, params):
    from multispec.tools.check import check_method

    report = check_method(method, runs=2000, pairs=1, vocab=4, n_tokens=3, seed=3, batch=8, **params)
    assert report.passed, report.pairs


@pytest.mark.slow
def test_lockstep_rows_sharing_one_random_stream_fail_the_law(monkeypatch):
    # known-wrong: every eight rows share one seed, so their outputs are one sample repeated, not independent ones
    from multispec import lockstep
    from multispec.tools.check import check_method

    real = lockstep.Lockstep.run

    def shared(self, prompts, max_new_tokens, seeds, *args, **kwargs):
        return real(self, prompts, max_new_tokens, [s - s % 8 for s in seeds], *args, **kwargs)

    monkeypatch.setattr(lockstep.Lockstep, "run", shared)
    report = check_method("sd", runs=2000, pairs=1, vocab=4, n_tokens=3, seed=3, batch=8, gamma=2)
    assert not report.passed, report.pairs


def test_methods_outside_lockstep_run_in_the_threaded_batch(pair, monkeypatch):
    from multispec import lockstep

    def refuse(*args, **kwargs):
        raise AssertionError("ran in lockstep")

    monkeypatch.setattr(lockstep.Lockstep, "run", refuse)
    want = [generate(*pair, p, "ar", max_new_tokens=4, temperature=0, score=False).token_ids for p in PROMPTS[:2]]
    for method in ("sd:gamma=2,bonus=false", "sd:gamma=2,confidence=0.5", "mcsd:k_config=2x1"):
        got = generate_batch(*pair, PROMPTS[:2], method, max_new_tokens=4, temperature=0, score=False)
        assert [r.token_ids for r in got] == want, method


def test_a_prompt_that_fills_the_context_is_refused_naming_it(pair):
    with pytest.raises(ValueError, match=r"prompt 1 has 130 tokens, which leaves no room"):
        generate_batch(*pair, [PROMPTS[0], [3] * 130], "ar", max_new_tokens=4)


@pytest.mark.parametrize("method", ["sd:gamma=auto,drafter=hybrid", "sd:gamma=auto", "sd:gamma=auto,drafter=suffix"])
def test_gamma_auto_alone_in_the_batch_draws_what_generate_draws(pair, lockstep_only, method):
    # a row alone prices its choices as `generate` prices them, so it makes the same choices and the same draws
    prompts = [PROMPTS[1], LONG]
    want = _alone(pair, prompts, method, temperature=1.0)
    got = [
        generate_batch(*pair, [p], method, max_new_tokens=12, seed=40 + i, temperature=1.0, score=False)[0]
        for i, p in enumerate(prompts)
    ]
    assert [r.token_ids for r in got] == want
    assert sum(got[1].stats["drafter_iterations"].values()) >= 1


def test_gamma_auto_rows_price_their_drafts_against_the_batch(pair, lockstep_only, monkeypatch):
    # in a batch each row's controller reads the batch's prices (`RowLoad`) and tells it its choice; greedy rows
    # still give `generate`'s tokens
    from multispec.batchload import RowLoad

    told = []
    real = RowLoad.chose
    monkeypatch.setattr(RowLoad, "chose", lambda self, *a: told.append(self._row) or real(self, *a))
    prompts = [*PROMPTS, LONG]
    want = _alone(pair, prompts, "ar", temperature=0.0)
    got = generate_batch(*pair, prompts, None, max_new_tokens=12, seed=40, temperature=0.0, score=False)
    assert [r.token_ids for r in got] == want
    assert len(set(told)) == len(prompts)
    assert all(sum(r.stats["drafter_iterations"].values()) >= 1 for r in got)


@pytest.mark.slow
def test_copies_accepted_without_their_ratio_test_fail_the_law(monkeypatch):
    # known-wrong: a copied draft's one-hot row read as zero, so every copied token passes its ratio test
    from multispec import lockstep
    from multispec.tools.check import check_method

    real = lockstep.Lockstep._propose

    def unchecked(self, rows, choices, chunks):
        drafts, draft_rows = real(self, rows, choices, chunks)
        for b, choice in enumerate(choices):
            if choice.copied and draft_rows is not None:
                draft_rows[b] = 0.0
        return drafts, draft_rows

    args = dict(runs=2000, pairs=1, vocab=4, n_tokens=3, seed=3, batch=8, gamma=2, drafter="lookup")
    assert check_method("sd", **args).passed  # the real rows pass
    monkeypatch.setattr(lockstep.Lockstep, "_propose", unchecked)
    report = check_method("sd", **args)
    assert not report.passed, report.pairs
