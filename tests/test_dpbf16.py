"""Our bfloat16 kernel (`multispec.models.dpbf16`): its products, its batch invariance, the model it routes and
restores, and the compiled steps that race it. The kernel needs a CPU with AVX512-BF16: elsewhere these tests
are skipped, and the compiled steps race the other variants only (tests/test_hf_backend.py)."""

import json
import re
import zipfile

import pytest
import torch

from multispec.models import dpbf16, hf
from multispec.models.hf import HFModel
from tests.conftest import tiny_llama

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]


@pytest.fixture(scope="module")
def kernel():
    why = dpbf16.unavailable()
    if why is not None:
        pytest.skip(f"the dpbf16 kernel does not run here: {why}")


def tiny_bf16(seed=6):
    return HFModel(tiny_llama(seed=seed, hidden=64).model.to(torch.bfloat16), None, name=f"tiny-bf16-{seed}")


def _close(out, x, weight, bias):
    """Within the rounding of a bfloat16 output of the exact product (float32 sums, in any order)."""
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    scale = x.double().abs() @ weight.double().abs().T
    return bool(((out.double() - exact).abs() <= 2**-8 * exact.abs() + 1e-6 * scale).all())


@pytest.mark.parametrize("outputs, inputs, rows, with_bias", [
    (40, 32, 1, False), (49, 64, 5, True), (96, 576, 16, False), (16, 2, 70, True), (3, 8, 9, True)])
def test_the_kernel_gives_the_product_rounded_to_bfloat16(kernel, outputs, inputs, rows, with_bias):
    gen = torch.Generator().manual_seed(outputs + rows)
    weight = torch.randn(outputs, inputs, generator=gen).bfloat16()
    x = torch.randn(2, rows, inputs, generator=gen).bfloat16()
    bias = torch.randn(outputs, generator=gen).bfloat16() if with_bias else None
    out = dpbf16.linear(x, dpbf16.pack(weight), bias, outputs)
    assert out.shape == (2, rows, outputs) and out.dtype == torch.bfloat16
    assert _close(out.float(), x.float(), weight.float(), None if bias is None else bias.float())
    # the same check fails a weight packed with each pair's two halves swapped
    swapped = dpbf16.pack(weight).flip(-1).contiguous()
    assert not _close(dpbf16.linear(x, swapped, bias, outputs).float(), x.float(), weight.float(),
                      None if bias is None else bias.float())


def test_a_rows_output_does_not_depend_on_the_rows_fed_with_it(kernel):
    # every output sums its products in one order whatever the rows (tiles of 8, 4, 2 and 1 rows alike)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(208, 96, generator=gen).bfloat16()
    packed = dpbf16.pack(weight)
    x = torch.randn(37, 96, generator=gen).bfloat16()
    full = dpbf16.linear(x, packed, None, 208)
    for start, count in ((0, 1), (3, 2), (5, 4), (9, 8), (17, 11), (30, 7)):
        assert torch.equal(dpbf16.linear(x[start : start + count], packed, None, 208), full[start : start + count])


def test_bad_shapes_are_refused_with_what_is_wrong(kernel):
    with pytest.raises(ValueError, match="odd number"):
        dpbf16.pack(torch.zeros(16, 5, dtype=torch.bfloat16))
    packed = dpbf16.pack(torch.zeros(16, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="the input has 6 features, the packed weight 8"):
        dpbf16.linear(torch.zeros(1, 6, dtype=torch.bfloat16), packed, None, 16)
    with pytest.raises(RuntimeError, match="bfloat16"):
        dpbf16.linear(torch.zeros(1, 8), packed, None, 16)


def test_routing_runs_the_maps_through_the_kernel_and_leaves_the_model_as_it_was(kernel):
    model = tiny_bf16().model
    names = {id(m): n for n, m in model.named_modules()}
    groups = [[names[id(m)].rsplit(".", 1)[1] for m in g] for g in dpbf16.shared_inputs(model)]
    assert groups == [["q_proj", "k_proj", "v_proj"], ["gate_proj", "up_proj"]] * 2
    own = model.model.layers[0].mlp.down_proj.forward  # an instance's own forward, as `linears.pack` sets
    model.model.layers[0].mlp.down_proj.forward = own
    keys = set(model.state_dict())
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits.float()
        for concat in (False, True):
            with dpbf16.routed(model, concat=concat) as routed:
                assert routed == 2 * 7 + 1
                q_proj = model.model.layers[1].self_attn.q_proj
                assert (dpbf16.BUFFER in q_proj._buffers) and (dpbf16.BIAS not in q_proj._buffers)
                got = model(input_ids=ids, use_cache=False).logits.float()
            assert (got - want).abs().max() < 0.05 * want.abs().max()
    assert set(model.state_dict()) == keys and not any(dpbf16.BUFFER in dict(m.named_buffers()) for m in
                                                       model.modules())
    assert model.model.layers[0].mlp.down_proj.forward is own
    assert "forward" not in model.model.layers[1].self_attn.q_proj.__dict__


def _products(package) -> int:
    """Our kernel's calls in the packaged step's generated code."""
    with zipfile.ZipFile(package) as z:
        source = "".join(z.read(n).decode() for n in z.namelist() if n.endswith("wrapper.cpp"))
    return len(re.findall(r"aoti_torch_proxy_executor_call_function\(", source))


def test_a_bfloat16_step_races_the_kernel_also_where_a_choice_was_stored_before_it(kernel, tmp_path, monkeypatch,
                                                                                 capsys):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    eager, compiled = tiny_bf16(), tiny_bf16()
    compiled.compile = True
    assert compiled.offers(hf.DPBF16) is None
    # an earlier process chose without our kernel (one that could not build it, or a version without it)
    earlier = {"kernel": "onednn", "step_ms": {"onednn": 1.0, "autotuned": 2.0, "onednn+concat": 1.5}}
    (tmp_path / "compiled_kernels.json").write_text(json.dumps({hf._kernel_key(compiled): {"1x4": earlier}}))
    ce, cc = eager.new_cache(), compiled.new_cache()
    eager.forward(ce, torch.tensor([PROMPT]))
    compiled.forward(cc, torch.tensor([PROMPT]))
    step = torch.tensor([[9, 4, 33]])
    want = eager.forward(ce, step)
    assert (compiled.forward(cc, step) - want).abs().max() < 0.05 * want.abs().max()
    (entry,) = json.loads((tmp_path / "compiled_kernels.json").read_text()).values()
    timed = entry["1x4"]["step_ms"]
    # only the stored choice and our kernel are raced (and its concatenated form, where it wins)
    assert {"onednn", "dpbf16"} <= set(timed) <= {"onednn", "dpbf16", "dpbf16+concat"}
    assert ("dpbf16+concat" in timed) == (min(timed, key=timed.get).startswith("dpbf16"))
    assert entry["1x4"]["before_ms"] == earlier["step_ms"] and entry["1x4"]["kernel"] == min(timed, key=timed.get)
    assert compiled.compiles == len(timed) and "(dpbf16 kernels)" in capsys.readouterr().err
    # a later process runs the stored choice: nothing compiled, nothing raced
    later = tiny_bf16()
    later.compile = True
    cache = later.new_cache()
    later.forward(cache, torch.tensor([PROMPT]))
    later.forward(cache, step)
    assert later.compiles == 0 and later.kernels[(1, 4)] == entry["1x4"]["kernel"]


def test_the_concat_form_makes_the_products_that_read_one_input_one(kernel, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    eager = tiny_bf16()
    want = eager.forward(eager.new_cache(), torch.tensor([PROMPT + [9, 4, 33]]))[:, -3:]
    counts = {}
    for kind in (hf.DPBF16, hf.DPBF16 + hf.CONCAT):
        model = tiny_bf16()
        model.compile, model.kernel = True, kind
        cache = model.new_cache()
        model.forward(cache, torch.tensor([PROMPT]))
        got = model.forward(cache, torch.tensor([[9, 4, 33]]))
        assert (got - want).abs().max() < 0.05 * want.abs().max()
        (package,) = (tmp_path / "compiled").rglob(f"{kind}-1x4.pt2")
        counts[kind] = _products(package)
    assert counts == {"dpbf16": 2 * 7 + 1, "dpbf16+concat": 2 * 4 + 1}


def test_a_float32_model_or_a_switched_off_kernel_is_not_offered_it(monkeypatch):
    model = tiny_llama(seed=1)
    model.compile = True
    assert model.offers(hf.DPBF16) == "it multiplies bfloat16 on a CPU"
    monkeypatch.setattr(dpbf16, "_state", {})
    monkeypatch.setenv(dpbf16.VARIABLE, "0")
    assert tiny_bf16().offers(hf.DPBF16) == "MULTISPEC_DPBF16=0"
