"""Eager steps of a Llama in one kernel call per layer (`multispec.models.hf.lean`): close to transformers' forward
(as close to float32 as transformers' own bfloat16 forward is; a wrong rotary embedding is not), a token's bits
the same alone, in a batch and fed with a prompt, and the layer inputs a feature-level head reads served by it."""

import pytest
import torch

from multispec.models import dpbf16, linears, static
from multispec.models.hf.lean import LeanLlama
from tests.models.helpers import _bf16_llama, _scored_after_a_prompt

pytestmark = pytest.mark.skipif(dpbf16.unavailable() is not None, reason="our kernel does not run here (AVX512-BF16)")


@pytest.fixture(autouse=True, params=[linears.TILES, linears.DPBF16])
def _tiles_chosen(request, tmp_path, monkeypatch):
    # every map on our kernel whatever its race says here (what makes a model take these steps), each test with
    # its own kernel store; on the AMX tile kernel, and on the dot-product kernel of CPUs without AMX (here: the
    # tiles turned off)
    if request.param == linears.TILES and not dpbf16.tiles_run():
        pytest.skip("no AMX tiles here")
    if request.param == linears.DPBF16:
        monkeypatch.setenv(dpbf16.TILES_VARIABLE, "0")
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    monkeypatch.setattr(linears, "_CHOICES", {})
    monkeypatch.setattr(linears, "_TILES", {})
    monkeypatch.setattr(linears, "GAIN", float("inf"))


TARGET = {"hidden": 576, "intermediate": 1536}  # the default target's layer shapes (9 heads of 64, 3 for keys)
DRAFT = {"hidden": 198, "intermediate": 1536, "heads": 9}  # the default draft's: narrower than its attention


def _model(lean: bool = True, monkeypatch=None, shape=TARGET):
    """Two layers of `shape`, bfloat16."""
    if not lean:
        monkeypatch.setenv("MULTISPEC_LEAN", "0")
    model = _bf16_llama(**shape)
    model.forward(model.new_cache(), torch.tensor([[1, 2, 3]]))  # decides the linear maps, then the steps
    if not lean:
        monkeypatch.delenv("MULTISPEC_LEAN")
    assert (model.lean() is not None) == lean, LeanLlama.why_not(model)
    # the kernel each map won on: on tiles where they take its inputs (multiples of 32), else the dot products
    if lean and shape is TARGET:
        assert model.lean().tiles == [0x7F if dpbf16.tiles_run() else 0] * 2
    elif lean:  # only the attention's output map and the MLP's down map read 576 and 1536 numbers
        assert model.lean().tiles == [0b1001000 if dpbf16.tiles_run() else 0] * 2
    return model


IDS = torch.randint(256, (1, 48), generator=torch.Generator().manual_seed(4))


def _distance_to_float32(model, shape=TARGET) -> float:
    reference = _bf16_llama(**shape)
    reference.model.float()
    with torch.inference_mode(), static.stock_attention(reference.model):
        want = reference.model(IDS).logits[0].float()
    got = model.forward(model.new_cache(), IDS)[0]
    return float((got - want).abs().mean())


@pytest.mark.parametrize("shape", [TARGET, DRAFT], ids=["target", "draft"])
def test_one_call_per_layer_is_as_close_to_float32_as_transformers_bfloat16(monkeypatch, shape):
    lean, plain = _model(shape=shape), _model(lean=False, monkeypatch=monkeypatch, shape=shape)
    calls = []
    step = type(lean.lean()).step
    monkeypatch.setattr(type(lean.lean()), "step", lambda self, *a: calls.append(1) or step(self, *a))
    ours, theirs = _distance_to_float32(lean, shape), _distance_to_float32(plain, shape)
    assert calls and ours <= 1.5 * theirs, (ours, theirs)
    # known-wrong: the rotary embedding turned the other way
    rotary = lean.model.model.rotary_emb
    monkeypatch.setattr(
        rotary, "forward", lambda x, positions, f=rotary.forward: (lambda c, s: (c, -s))(*f(x, positions))
    )
    assert _distance_to_float32(lean, shape) > 3 * theirs


@pytest.mark.parametrize("shape", [TARGET, DRAFT], ids=["target", "draft"])
def test_a_token_gets_its_bits_alone_in_a_batch_and_in_a_sequence_of_its_own(monkeypatch, shape):
    model = _model(shape=shape)
    prompts = [list(range(3, 40)), list(range(50, 55)), list(range(7, 30)), list(range(90, 101))]
    cache = model.new_batch_cache(len(prompts) + 1, 256)
    views = [static.RowKV(cache, r) for r in range(len(prompts) + 1)]
    for view, prompt in zip(views, prompts, strict=False):
        model.forward(view, torch.tensor([prompt]))

    def row0(rows: int, prompt_beside: bool = False, which: int = 0) -> torch.Tensor:
        feeds = [(r, views[r], torch.tensor([9 + r]), None, None, 0) for r in range(rows)]
        if prompt_beside:
            views[-1].length = 0
            feeds.append((len(prompts), views[-1], torch.arange(1, 21), None, None, 1, 19))
        out = model.forward_rows(cache, feeds)[which]
        for r in range(rows):
            views[r].length = len(prompts[r])
        return out

    alone = row0(1)
    assert torch.equal(alone, row0(4)) and torch.equal(alone, row0(2, prompt_beside=True))
    single = model.new_cache()
    model.forward(single, torch.tensor([prompts[0]]))
    assert torch.equal(model.forward(single, torch.tensor([[9]]))[0], alone)
    # known-wrong: every packed token reads and writes the first fed row's cache, not its own
    second = row0(2, which=1)
    step = LeanLlama.step

    def one_row(self, ids, positions, masks, slots, keys, values, keep, fused, packed):
        if packed is not None:
            packed.token_rows = torch.zeros_like(packed.token_rows)
        return step(self, ids, positions, masks, slots, keys, values, keep, fused, packed)

    monkeypatch.setattr(LeanLlama, "step", one_row)
    assert not torch.equal(row0(2, which=1), second)


def test_a_chain_fed_with_the_prompt_gets_the_bits_of_one_token_steps(monkeypatch):
    model = _model()
    chain = _scored_after_a_prompt(model, 4, step_by_step=False)
    assert torch.equal(chain, _scored_after_a_prompt(model, 4, step_by_step=True))
    # known-wrong: the drafts attended through torch's fused attention with the prompt
    spans = LeanLlama.fused_spans
    monkeypatch.setattr(
        LeanLlama,
        "fused_spans",
        staticmethod(lambda packed, fused, *rows: [0, 204] if fused else spans(packed, fused, *rows)),
    )
    wrong = _scored_after_a_prompt(model, 4, step_by_step=False)
    if torch.equal(wrong, chain):
        pytest.skip("this machine's fused attention gives the steps' bits: the wrong variant shows nothing")


def test_each_row_of_a_cache_of_several_gets_the_logits_it_gets_alone(monkeypatch):
    # beam search and its kin feed several rows of one cache (not packed): every row is computed and returned,
    # with its own cache row, the bits it gets fed alone (its prompt with fused attention, then a step)
    model = _model()
    calls = []
    step = type(model.lean()).step
    monkeypatch.setattr(type(model.lean()), "step", lambda self, *a: calls.append(1) or step(self, *a))
    prompts = torch.randint(256, (3, 20), generator=torch.Generator().manual_seed(5))
    nxt = torch.tensor([[7], [8], [9]])
    cache = model.new_cache()
    first = model.forward(cache, prompts, fused_prefix=19)
    then = model.forward(cache, nxt)
    assert calls and first.shape == (3, 20, 256) and then.shape == (3, 1, 256)
    for row in range(3):
        alone = model.new_cache()
        assert torch.equal(model.forward(alone, prompts[row : row + 1], fused_prefix=19)[0], first[row])
        assert torch.equal(model.forward(alone, nxt[row : row + 1])[0], then[row])


def _read_layers(model, layers=(0, 1)) -> tuple[list[torch.Tensor], torch.Tensor]:
    with model.hidden_features(layers) as seen:
        logits = model.forward(model.new_cache(), IDS)
    return seen, logits


def _mean_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().mean() / b.float().abs().mean())


def test_the_layer_inputs_a_head_reads_come_from_the_one_call_per_layer_step(monkeypatch):
    # a feature-level head's target keeps the fast step: the inputs of the layers read pass through it, and they
    # are transformers' own (as close as the two forwards' bfloat16 roundings allow)
    lean, plain = _model(), _model(lean=False, monkeypatch=monkeypatch)
    calls = []
    step = type(lean.lean()).step
    monkeypatch.setattr(type(lean.lean()), "step", lambda self, *a: calls.append(1) or step(self, *a))
    ours, logits = _read_layers(lean)
    assert calls and lean.lean().usable()  # the hooks stay on the layers, idle
    monkeypatch.setenv("MULTISPEC_LEAN", "0")
    theirs, _ = _read_layers(plain)
    assert len(ours) == len(theirs) == 2 and ours[1].shape == theirs[1].shape == (1, 48, 576)
    assert torch.equal(ours[0], theirs[0])  # the embeddings
    gaps = [_mean_gap(o, t) for o, t in zip(ours, theirs, strict=True)]
    assert gaps[1] < 0.02, gaps
    # and reading them changes nothing in the logits
    monkeypatch.delenv("MULTISPEC_LEAN")
    assert torch.equal(lean.forward(lean.new_cache(), IDS), logits)
    # known-wrong: each layer's output kept instead of its input
    ops = torch.ops.multispec_dpbf16

    class Shifted:
        def __getattr__(self, name):
            return getattr(ops, name)

        @staticmethod
        def llama_layer(hidden, *rest):
            out = ops.llama_layer(hidden, *rest)
            hidden.copy_(out)  # the tensor kept as the layer's input now holds its output
            return out

    monkeypatch.setattr(torch.ops, "multispec_dpbf16", Shifted())
    wrong, _ = _read_layers(lean)
    assert _mean_gap(wrong[1], theirs[1]) > 10 * max(gaps[1], 1e-3)
