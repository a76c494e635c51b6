"""Reduced draft vocabularies (`multispec.models.vocab`): the law stays the target's, greedy stays `ar`'s, and a
transformers draft's cut head scores the kept tokens as the whole head does."""

import pytest
import torch

from multispec import generate
from multispec.models.markov import MarkovLM
from multispec.models.vocab import ReducedVocab, read_token_counts, reduce_vocab, save_token_counts, top_ids
from multispec.tools.check import check_method
from tests.conftest import tiny_llama
from tests.wrong_rules import target_over_draft_vocab_verify

RUNS = 2000


@pytest.mark.parametrize(
    "method, params",
    [
        ("sd", {"gamma": 2}),
        pytest.param("sd", {"gamma": "auto"}, marks=pytest.mark.slow),
        pytest.param("mcsd", {"k_config": "2x1"}, marks=pytest.mark.slow),
        pytest.param("specinfer", {"k_config": "2x1"}, marks=pytest.mark.slow),
    ],
)
def test_a_draft_of_two_tokens_out_of_four_keeps_the_target_law(method, params):
    report = check_method(method, runs=RUNS, pairs=2, vocab=4, n_tokens=3, seed=1, draft_vocab=2, **params)
    assert report.passed, report.pairs


def test_renormalising_the_target_over_the_draft_vocabulary_fails_the_same_check(monkeypatch):
    import multispec.decoding.sd

    monkeypatch.setattr(multispec.decoding.sd, "speculative_verify", target_over_draft_vocab_verify)
    report = check_method("sd", runs=RUNS, pairs=2, vocab=4, n_tokens=3, seed=1, draft_vocab=2, gamma=2)
    assert not report.passed


def test_the_reduced_draft_proposes_only_kept_tokens():
    torch.manual_seed(0)
    draft = MarkovLM(torch.softmax(torch.randn(6, 6), -1))
    reduced = reduce_vocab(draft, 3)
    assert reduced is reduce_vocab(draft, 3)  # made once per model and size
    kept = set(reduced.ids.tolist())
    assert kept == set(top_ids(draft.token_counts, 3).tolist())
    logits = reduced.forward(reduced.new_cache(), torch.arange(6)[None])
    assert logits.shape == (1, 6, 6)
    assert torch.isinf(logits[..., [i for i in range(6) if i not in kept]]).all()
    whole = draft.forward(draft.new_cache(), torch.arange(6)[None])
    assert torch.equal(logits[..., sorted(kept)], whole[..., sorted(kept)])


def test_top_ids_keep_stop_tokens_and_break_ties_by_id():
    counts = torch.tensor([5, 9, 9, 0, 7])
    assert top_ids(counts, 3).tolist() == [1, 2, 4]
    assert top_ids(counts, 3, always={3}).tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="draft_vocab must be in"):
        top_ids(counts, 6)


def test_bad_sizes_are_refused_before_decoding():
    torch.manual_seed(0)
    target = MarkovLM(torch.softmax(torch.randn(4, 4), -1))
    draft = MarkovLM(torch.softmax(torch.randn(4, 4), -1))
    with pytest.raises(ValueError, match="draft_vocab must be an integer >= 1"):
        generate(target, draft, [0], method="sd", draft_vocab=0)
    with pytest.raises(ValueError, match="draft_vocab must be in"):
        generate(target, draft, [0], method="sd", draft_vocab=5)


def test_a_cut_head_scores_the_kept_tokens_as_the_whole_head(tmp_path):
    draft = tiny_llama(vocab=64, seed=3)
    counts = torch.arange(64).flip(0)  # token 0 most frequent
    save_token_counts(tmp_path, counts, "test")
    assert torch.equal(read_token_counts(tmp_path), counts)
    draft.token_counts = counts
    reduced = reduce_vocab(draft, 16)
    assert isinstance(reduced, ReducedVocab) and reduced.cut
    assert reduced.ids.tolist() == list(range(16))
    ids = torch.tensor([[5, 17, 3, 42, 8, 11]])
    cut = reduced.forward(reduced.new_cache(), ids, batch_invariant=False)
    whole = draft.forward(draft.new_cache(), ids, batch_invariant=False)
    torch.testing.assert_close(cut[..., :16], whole[..., :16], rtol=1e-5, atol=1e-5)
    assert torch.isinf(cut[..., 16:]).all()
    # the whole model is unchanged: its head still has every row
    assert draft.model.get_output_embeddings().weight.shape[0] == 64


@pytest.mark.parametrize("method", ["sd:gamma=3", "sd:gamma=auto,drafter=hybrid", "mcsd:k_config=2x2x1"])
def test_greedy_with_a_reduced_draft_is_greedy_ar(method):
    target, draft = tiny_llama(vocab=64, seed=1), tiny_llama(vocab=64, seed=2, hidden=16)
    draft.token_counts = torch.bincount(torch.arange(64) % 40, minlength=64)  # tokens 0..39 kept first
    prompt = [5, 17, 3, 42, 8, 11]
    ar = generate(target, None, prompt, method="ar", temperature=0, max_new_tokens=24, score=False)
    out = generate(target, draft, prompt, method=method, temperature=0, max_new_tokens=24, score=False, draft_vocab=8)
    assert out.token_ids == ar.token_ids


def test_a_cut_head_of_a_draft_compiled_by_default_is_settled_as_the_draft_was(monkeypatch):
    # `compile="auto"`: the cut head gets the same policy (compiled where its steps are kept, else eager while a
    # background worker makes them), not a compile in the foreground of a first run
    from multispec.models.hf import HFModel, background

    base = tiny_llama(vocab=64, seed=4)
    draft = HFModel(base.model, None, name="tiny-draft", compile="auto", source="tiny-draft-folder")
    draft.enable_compile()  # as `background.settle` does where the draft's steps are kept
    draft.token_counts = torch.arange(64).flip(0)
    settled = []
    monkeypatch.setattr(background, "settle", lambda hf, role: settled.append((hf, role)))
    cut = reduce_vocab(draft, 16).scorer
    assert cut is not draft and cut.auto_compile and not cut.compile and settled == [(cut, "draft")]
    # a worker loads the draft from where it came and cuts the same rows: its status is the cut head's own
    assert (cut.source, cut.draft_vocab) == ("tiny-draft-folder", 16)
    assert background.worker_source(cut) != background.worker_source(draft)
    command = background.worker_command(cut, "draft")
    assert command[command.index("--draft") + 1] == "tiny-draft-folder"
    assert command[command.index("--draft-vocab") + 1] == "16"
    # rows chosen by the caller cannot be cut again by a worker: such a head stays eager (no source)
    chosen = draft.with_head_rows(torch.tensor([3, 1, 4, 15]))
    assert chosen.source is None and chosen.draft_vocab is None and not chosen.compile
    # a draft compiled because the caller asked (compile=True) cuts heads compiled the same way
    asked = HFModel(base.model, None, name="tiny-draft-asked", compile=True)
    assert asked.with_head_rows(torch.tensor([3, 1, 4, 15])).compile


def test_compile_refuses_a_draft_vocabulary_of_no_tokens(capsys):
    from multispec.entrypoints.cli import main

    assert main(["compile", "--only", "draft", "--draft-vocab", "0"]) != 0
    assert "--draft-vocab 0: a number of tokens" in capsys.readouterr().err
