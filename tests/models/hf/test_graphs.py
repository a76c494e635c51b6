"""CUDA graphs of the static cache's steps (`HFModel.graphs`).

A captured step reads every slot of the cache buffers, its mask spanning the capacity. The first tests run
that layout on a CPU, with the step called directly where a CUDA device would replay its graph; the others
need a CUDA device (skipped elsewhere: CI has none) and run the real capture and replay."""

import pytest
import torch

from multispec import generate
from tests.conftest import tiny_family, tiny_llama

PROMPT = [5, 17, 3, 42, 8, 11]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# methods whose greedy tokens must not change with the step's layout (capacity-wide masks, captured graphs)
GREEDY_METHODS = [
    ("sd", {"gamma": 4}),
    ("mcsd", {"k_config": "2x2x1"}),
    ("specinfer", {}),
    ("batch-sd", {"drafts": 2, "gamma": 3}),
    ("beam", {"width": 3}),
]


def full_logits(model, ids):
    with torch.no_grad():
        return model.model(torch.tensor([ids], device=model.device)).logits[0].float()


def capacity_wide(model):
    """The model as a graphed step sees it (bucketed new tokens, a mask over the whole capacity), with the
    step called directly instead of a replay: what a CPU can check of the layout."""
    model.graphs = True
    model.graphed.run = lambda ids, pos, masks, slots, cache: model.step(
        ids, pos, masks, slots, cache.keys, cache.values
    )
    return model


@pytest.mark.parametrize("family", ["Llama", "Mistral", "Gemma2"])  # Mistral and Gemma 2 slide a window of 4
def test_capacity_wide_masks_give_the_models_own_logits(family):
    model = capacity_wide(tiny_family(family, seed=2))
    cache = model.new_cache()
    model.forward(cache, torch.tensor([PROMPT]))
    seq = list(PROMPT)
    for tokens in ([9], [4, 33, 21], [7, 2, 40, 11, 5]):
        got = model.forward(cache, torch.tensor([tokens]))
        seq += tokens
        assert cache.capacity > cache.length  # the mask spans slots that hold nothing yet
        assert torch.allclose(got[0], full_logits(model, seq)[-len(tokens) :], atol=1e-5)


@pytest.mark.parametrize(
    "method, params",
    GREEDY_METHODS,
)
def test_capacity_wide_greedy_methods_equal_them_without(method, params):
    target, draft = capacity_wide(tiny_llama(seed=5)), capacity_wide(tiny_llama(seed=6, layers=1))
    plain_target, plain_draft = tiny_llama(seed=5), tiny_llama(seed=6, layers=1)
    want = generate(plain_target, plain_draft, PROMPT, method=method, temperature=0, max_new_tokens=40, **params)
    out = generate(target, draft, PROMPT, method=method, temperature=0, max_new_tokens=40, **params)
    assert out.token_ids == want.token_ids
    if method != "beam":  # beam search's output is not ar's
        ar = generate(plain_target, None, PROMPT, method="ar", temperature=0, max_new_tokens=40)
        assert out.token_ids == ar.token_ids


def on_cuda(model):
    """The same model on the CUDA device (wrapped again: the cache's layout is probed where it runs)."""
    from multispec.models.hf import HFModel

    moved = HFModel(model.model.to("cuda"), None, name=model.name)
    assert moved.graphs  # on by default on a CUDA device
    return moved


@cuda
def test_a_replayed_step_gives_the_eager_logits_and_is_captured_once_per_shape():
    graphed, eager = on_cuda(tiny_llama(seed=3)), on_cuda(tiny_llama(seed=3))
    eager.graphs = False
    cg, ce = graphed.new_cache(), eager.new_cache()
    graphed.forward(cg, torch.tensor([PROMPT]))  # the prompt runs eagerly
    eager.forward(ce, torch.tensor([PROMPT]))
    assert graphed.graph_captures == 0
    for tokens in ([9, 4, 33], [2, 40, 11], [5, 8, 30], [1]):
        step = torch.tensor([tokens])
        got = graphed.forward(cg, step)
        assert torch.allclose(got, eager.forward(ce, step), atol=1e-4)
        assert cg.length == ce.length
    assert graphed.graph_captures == 2  # buckets of 4 and 1
    # the returned logits are the caller's: a later replay leaves them alone
    kept = graphed.forward(cg, torch.tensor([[7]]))
    copy = kept.clone()
    graphed.forward(cg, torch.tensor([[9]]))
    assert torch.equal(kept, copy)


@cuda
def test_a_compiled_step_under_a_graph_gives_the_eager_logits():
    graphed, eager = on_cuda(tiny_llama(seed=3)), on_cuda(tiny_llama(seed=3))
    graphed.compile, eager.graphs = True, False
    cg, ce = graphed.new_cache(), eager.new_cache()
    graphed.forward(cg, torch.tensor([PROMPT]))
    eager.forward(ce, torch.tensor([PROMPT]))
    for tokens in ([9, 4, 33], [2, 40, 11], [1]):
        step = torch.tensor([tokens])
        assert torch.allclose(graphed.forward(cg, step), eager.forward(ce, step), atol=1e-4)
    assert graphed.graph_captures == 2 and graphed.compiles >= 1


@cuda
@pytest.mark.parametrize(
    "method, params",
    GREEDY_METHODS,
)
def test_greedy_methods_with_cuda_graphs_equal_them_without(method, params):
    target, draft = on_cuda(tiny_llama(seed=5)), on_cuda(tiny_llama(seed=6, layers=1))
    plain_target, plain_draft = on_cuda(tiny_llama(seed=5)), on_cuda(tiny_llama(seed=6, layers=1))
    plain_target.graphs = plain_draft.graphs = False
    ar = generate(plain_target, None, PROMPT, method="ar", temperature=0, max_new_tokens=40)
    want = generate(plain_target, plain_draft, PROMPT, method=method, temperature=0, max_new_tokens=40, **params)
    got = generate(target, draft, PROMPT, method=method, temperature=0, max_new_tokens=40, **params)
    assert got.token_ids == want.token_ids
    if method != "beam":
        assert got.token_ids == ar.token_ids
    assert target.graph_captures > 0
    # a second call's cache buffers come back at the same addresses: its steps replay the graphs captured
    assert got.stats["graph_captures"] == target.graph_captures + draft.graph_captures > 0
    again = generate(target, draft, PROMPT, method=method, temperature=0, max_new_tokens=40, **params)
    assert again.token_ids == got.token_ids
    assert again.stats["graph_captures"] <= 2


@cuda
def test_a_step_that_cannot_be_captured_runs_uncaptured_with_one_line_saying_why(monkeypatch, capsys):
    model = on_cuda(tiny_llama(seed=3))
    eager = on_cuda(tiny_llama(seed=3))
    eager.graphs = False

    def refuse(*_, **__):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(model, "_capture", refuse)
    got = generate(model, None, PROMPT, method="ar", temperature=0, max_new_tokens=8)
    assert got.token_ids == generate(eager, None, PROMPT, method="ar", temperature=0, max_new_tokens=8).token_ids
    assert model.graphs and len(got.stats["fallbacks"]) == 1  # this generation ran uncaptured, the model is as it was
    assert "runs without CUDA graphs" in capsys.readouterr().err
