"""Packed linear maps (`multispec.models.linears`): eager steps only, where they ran faster, the logits kept."""

import copy

import pytest
import torch

from multispec.models import static
from tests.conftest import tiny_llama
from tests.models.helpers import PROMPT, _bf16_llama


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    # compiled steps are kept on disk beside the cost file: each test has its own folder, so that none loads a
    # step another test compiled
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_maps_serve_eager_steps_only_and_keep_the_logits(dtype, monkeypatch, tmp_path):
    from multispec.models import linears

    if linears.packable(tiny_llama().model) is not None or (
        dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    ):
        pytest.skip("no oneDNN packing for this dtype here")
    monkeypatch.setattr(linears, "_CHOICES", {})
    monkeypatch.setattr(linears, "kernel_store_path", lambda: tmp_path / "kernels.json")  # no stored choice
    monkeypatch.setattr(linears, "GAIN", float("inf"))  # packed whatever the timing said
    make = (lambda: tiny_llama(seed=6)) if dtype == torch.float32 else _bf16_llama
    plain, packed = make(), make()
    plain.packed_linears = False
    ids = torch.tensor([PROMPT])
    out_plain = plain.forward(plain.new_cache(), ids)
    out_packed = packed.forward(packed.new_cache(), ids)
    assert packed.packed_linears is True
    assert all(linears.packed_weight(m) is not None for m in packed.model.modules() if type(m) is torch.nn.Linear)
    assert torch.allclose(out_packed, out_plain, atol=1e-4 if dtype == torch.float32 else 0.05)
    # the packed weights are what eager steps read, and only they: with them zeroed, the steps change and
    # transformers' own calls on the model (the bench's hf peers) still give the plain model's bits
    for m in packed.model.modules():
        if type(m) is torch.nn.Linear:
            linears._PACKED[m] = (
                linears._PACKED[m][0],
                torch.ops.mkldnn._reorder_linear_weight(torch.zeros_like(m.weight), 1),
                linears.ONEDNN,
            )
    assert not torch.allclose(packed.forward(packed.new_cache(), ids), out_plain, atol=0.05)
    with torch.inference_mode(), static.stock_attention(plain.model, packed.model):
        assert torch.equal(packed.model(ids).logits, plain.model(ids).logits)
    # a copy of the model (distill's bfloat16 teacher is one) is not packed: even in an eager step's context it
    # runs the plain weights
    clone = copy.deepcopy(packed.model)
    with torch.inference_mode(), linears.active(), static.stock_attention(clone, plain.model):
        assert torch.equal(clone(ids).logits, plain.model(ids).logits)


def test_linear_maps_stay_plain_where_packed_ran_no_faster_or_packing_is_switched_off(monkeypatch, tmp_path):
    from multispec.models import linears

    model = tiny_llama(seed=7)
    if linears.packable(model.model) is not None:
        pytest.skip("no oneDNN packing here")
    monkeypatch.setattr(linears, "_CHOICES", {})
    store = tmp_path / "kernels.json"
    monkeypatch.setattr(linears, "kernel_store_path", lambda: store)
    monkeypatch.setattr(linears, "GAIN", 0.0)  # packed would have to take no time at all
    model.forward(model.new_cache(), torch.tensor([PROMPT]))
    assert model.packed_linears is False
    # the choice is kept for the machine: another process (here: a cleared memory) reads it, not a new race
    monkeypatch.setattr(linears, "_CHOICES", {})
    monkeypatch.setattr(linears, "GAIN", float("inf"))
    again = tiny_llama(seed=7)
    again.forward(again.new_cache(), torch.tensor([PROMPT]))
    assert again.packed_linears is False and "packed-linears" in store.read_text()
    assert not any(linears.packed_weight(m) is not None for m in model.model.modules() if type(m) is torch.nn.Linear)
    chosen, plain_seconds, packed_seconds = next(iter(linears._CHOICES.values()))
    assert chosen is False and plain_seconds > 0 and packed_seconds > 0
    monkeypatch.setenv("MULTISPEC_PACKED_LINEARS", "0")
    assert linears.packable(model.model) == "MULTISPEC_PACKED_LINEARS=0"
    fresh = tiny_llama(seed=7)
    fresh.forward(fresh.new_cache(), torch.tensor([PROMPT]))
    assert fresh.packed_linears is False


@pytest.mark.parametrize("kind", ["tiles", "dpbf16"])
def test_eager_bfloat16_steps_run_our_kernel_where_it_won_its_race(monkeypatch, tmp_path, kind):
    # the maps our kernel takes race it against oneDNN's choice: on a CPU with AMX the tile kernel, on one with
    # AVX512-BF16 only the dot-product kernel (here: the tiles turned off); kept, eager steps read its weights
    # (zeroed, the logits change), and a row's logits no longer depend on the rows fed with it
    from multispec.models import dpbf16, linears

    if dpbf16.unavailable() is not None:
        pytest.skip(f"our kernel does not run here: {dpbf16.unavailable()}")
    if kind == linears.TILES and not dpbf16.tiles_run():
        pytest.skip("no AMX tiles here")
    if kind == linears.DPBF16:
        monkeypatch.setenv(dpbf16.TILES_VARIABLE, "0")
    assert linears.ours() == kind
    store = tmp_path / "kernels.json"
    monkeypatch.setattr(linears, "_CHOICES", {})
    monkeypatch.setattr(linears, "_TILES", {})
    monkeypatch.setattr(linears, "kernel_store_path", lambda: store)
    monkeypatch.setattr(linears, "GAIN", float("inf"))  # kept whatever the timing said
    plain, tiled = _bf16_llama(), _bf16_llama()
    plain.packed_linears = False
    ids = torch.tensor([PROMPT])
    out_plain = plain.forward(plain.new_cache(), ids)
    out_tiled = tiled.forward(tiled.new_cache(), ids)
    maps = [m for m in tiled.model.modules() if type(m) is torch.nn.Linear]
    stored = "tile-linears" if kind == linears.TILES else "dpbf16-linears"
    assert all(linears.packed_kind(m) == kind for m in maps) and stored in store.read_text()
    assert torch.allclose(out_tiled, out_plain, atol=0.05)
    assert tiled.batch_rows == 1  # measured: the bits of a row do not change with the rows fed with it
    for m in maps:
        linears._PACKED[m] = (linears._PACKED[m][0], dpbf16.pack(torch.zeros_like(m.weight)), kind)
    assert not torch.allclose(tiled.forward(tiled.new_cache(), ids), out_plain, atol=0.05)
