"""Our bfloat16 kernel (`multispec.models.dpbf16`): its products, its batch invariance, the model it routes and
restores, and the compiled steps that race it. The kernel needs a CPU with AVX512-BF16: elsewhere these tests
are skipped, and the compiled steps race the other variants only (tests/models/hf/test_model.py)."""

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


@pytest.mark.parametrize(
    "outputs, inputs, rows, with_bias",
    [(40, 32, 1, False), (49, 64, 5, True), (96, 576, 16, False), (16, 2, 70, True), (3, 8, 9, True)],
)
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
    assert not _close(
        dpbf16.linear(x, swapped, bias, outputs).float(),
        x.float(),
        weight.float(),
        None if bias is None else bias.float(),
    )


def test_a_rows_output_does_not_depend_on_the_rows_fed_with_it(kernel):
    # every output sums its products in one order whatever the rows (tiles of 8, 4, 2 and 1 rows alike)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(208, 96, generator=gen).bfloat16()
    packed = dpbf16.pack(weight)
    x = torch.randn(37, 96, generator=gen).bfloat16()
    full = dpbf16.linear(x, packed, None, 208)
    for start, count in ((0, 1), (3, 2), (5, 4), (9, 8), (17, 11), (30, 7)):
        assert torch.equal(dpbf16.linear(x[start : start + count], packed, None, 208), full[start : start + count])


@pytest.fixture(scope="module")
def tiles(kernel):
    if not dpbf16.tiles_run():
        pytest.skip("no AMX tiles here (a CPU with AMX-BF16 runs the tile kernel)")


@pytest.mark.parametrize("outputs, inputs", [(40, 64), (576, 576), (1536, 576), (96, 1536), (50, 96)])
def test_the_tile_kernel_gives_the_product_and_each_row_its_bits_whatever_the_rows(tiles, outputs, inputs):
    # tiles of 16 rows (zero rows pad the last), four blocks of 16 outputs per item and a remainder of fewer
    gen = torch.Generator().manual_seed(outputs + inputs)
    weight = torch.randn(outputs, inputs, generator=gen).bfloat16()
    bias = torch.randn(outputs, generator=gen).bfloat16()
    packed = dpbf16.pack(weight)
    for rows in (1, 5, 16, 17, 40):
        x = torch.randn(rows, inputs, generator=gen).bfloat16()
        out = dpbf16.linear_tiles(x, packed, bias, outputs)
        assert out.shape == (rows, outputs) and out.dtype == torch.bfloat16
        assert _close(out.float(), x.float(), weight.float(), bias.float())
        alone = torch.cat([dpbf16.linear_tiles(x[i : i + 1], packed, bias, outputs) for i in range(rows)])
        assert torch.equal(alone, out), rows
    # the same check fails a weight packed with each pair's two halves swapped
    assert not _close(
        dpbf16.linear_tiles(x, packed.flip(-1).contiguous(), bias, outputs).float(),
        x.float(),
        weight.float(),
        bias.float(),
    )
    with pytest.raises(RuntimeError, match="multiples of 32"):
        dpbf16.linear_tiles(x[:, :48], dpbf16.pack(weight[:, :48]), None, outputs)


@pytest.mark.parametrize("mode", dpbf16.PREFETCHES)
def test_every_prefetch_gives_the_same_bits(kernel, mode):
    # a prefetch only asks for lines early: every mode gives mode none's bits, on every tile and thread split
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(400, 96, generator=gen).bfloat16()  # 8 groups of 3 blocks and a remainder block
    packed = dpbf16.pack(weight)
    x = torch.randn(19, 96, generator=gen).bfloat16()
    try:
        for rows in (1, 2, 3, 8, 11, 19):
            dpbf16.set_prefetch({1: "none"})
            expected = dpbf16.linear(x[:rows], packed, None, 400)
            dpbf16.set_prefetch({1: mode})
            out = dpbf16.linear(x[:rows], packed, None, 400)
            assert torch.equal(out, expected), rows
            assert _close(out.float(), x[:rows].float(), weight.float(), None)
    finally:
        dpbf16.set_prefetch(dpbf16._calibrated_prefetch(dpbf16._digest()))


def test_the_prefetch_is_calibrated_once_per_machine_and_kept(kernel, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    small = dpbf16.calibrate(rows=(1, 8), megabytes=4, repeats=1)
    assert set(small["ms"]) == {1, 8} and all(set(ms) == set(dpbf16.PREFETCHES) for ms in small["ms"].values())
    for rows, mode in small["modes"].items():  # a mode other than none only where it ran faster by the margin
        ms = small["ms"][rows]
        assert mode == "none" or ms[mode] < (1 - dpbf16.PREFETCH_MARGIN) * ms["none"]
    calls = []
    monkeypatch.setattr(dpbf16, "calibrate", lambda: calls.append(1) or small)
    assert dpbf16._calibrated_prefetch("abc") == small["modes"] and calls == [1]
    assert dpbf16._calibrated_prefetch("abc") == small["modes"] and calls == [1]  # read back, not measured again
    dpbf16._calibrated_prefetch("another build")
    assert calls == [1, 1]
    with pytest.raises(ValueError, match="unknown modes.*far"):
        dpbf16.set_prefetch({1: "far"})


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
    assert set(model.state_dict()) == keys and not any(
        dpbf16.BUFFER in dict(m.named_buffers()) for m in model.modules()
    )
    assert model.model.layers[0].mlp.down_proj.forward is own
    assert "forward" not in model.model.layers[1].self_attn.q_proj.__dict__


def _products(package) -> int:
    """Our kernel's calls in the packaged step's generated code."""
    with zipfile.ZipFile(package) as z:
        source = "".join(z.read(n).decode() for n in z.namelist() if n.endswith("wrapper.cpp"))
    return len(re.findall(r"aoti_torch_proxy_executor_call_function\(", source))


@pytest.mark.slow  # compiles
def test_a_bfloat16_step_races_the_kernel_also_where_a_choice_was_stored_before_it(
    kernel, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    eager, compiled = tiny_bf16(), tiny_bf16()
    compiled.compile = True
    assert compiled.steps.offers(hf.DPBF16) is None
    # an earlier process chose without our kernel (one that could not build it, or a version without it)
    earlier = {"kernel": "onednn", "step_ms": {"onednn": 1.0, "autotuned": 2.0, "onednn+concat": 1.5}}
    (tmp_path / "compiled_kernels.json").write_text(json.dumps({hf.kernel_key(compiled): {"1x4": earlier}}))
    ce, cc = eager.new_cache(), compiled.new_cache()
    eager.forward(ce, torch.tensor([PROMPT]))
    compiled.forward(cc, torch.tensor([PROMPT]))
    step = torch.tensor([[9, 4, 33]])
    want = eager.forward(ce, step)
    assert (compiled.forward(cc, step) - want).abs().max() < 0.05 * want.abs().max()
    # (the store also holds machine-wide choices, such as our kernel's prefetch mode)
    entry = json.loads((tmp_path / "compiled_kernels.json").read_text())[hf.kernel_key(compiled)]
    timed = entry["1x4"]["step_ms"]
    # only the stored choice and our kernels are raced (and the concatenated form of dpbf16, where it wins)
    raced = {"onednn", "dpbf16", hf.INVARIANT_DPBF16}
    assert raced <= set(timed) <= {*raced, "dpbf16+concat"}
    # (the times are kept rounded to microseconds: two variants can tie)
    if "dpbf16+concat" in timed:  # raced beside the plain form, which won the first race
        assert min(timed, key=timed.get) in ("dpbf16", "dpbf16+concat", hf.INVARIANT_DPBF16)
    else:  # the plain form did not win it outright
        assert timed["dpbf16"] >= min(timed[k] for k in raced - {"dpbf16"})
    assert entry["1x4"]["before_ms"] == earlier["step_ms"] and entry["1x4"]["kernel"] == min(timed, key=timed.get)
    assert compiled.compiles == len(timed) and "(dpbf16 kernels)" in capsys.readouterr().err
    # only the kept variant's step stays on disk, the batch-invariant one's too where it lost
    assert [p.name for p in (tmp_path / "compiled").rglob("*.pt2")] == [f"{entry['1x4']['kernel']}-1x4.pt2"]
    # a later process runs the stored choice: nothing compiled, nothing raced
    later = tiny_bf16()
    later.compile = True
    cache = later.new_cache()
    later.forward(cache, torch.tensor([PROMPT]))
    later.forward(cache, step)
    assert later.compiles == 0 and later.steps.kernels[(1, 4)] == entry["1x4"]["kernel"]


@pytest.mark.slow  # compiles
def test_a_fast_step_runs_the_batch_invariant_variant_where_it_won_the_race(kernel, tmp_path, monkeypatch):
    # a shape whose race our batch-invariant step won (stored, as an earlier process would have): a draft's
    # feeds (not batch-invariant) run it, with the bits a batch-invariant model's steps give
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    draft = HFModel(tiny_bf16().model, None, name="tiny-bf16-6", compile=True)
    assert draft.steps.offers(hf.INVARIANT_DPBF16) is None
    won = {"kernel": hf.INVARIANT_DPBF16, "step_ms": {k: 1.0 for k in (*hf.VARIANTS, *hf.RACED)}}
    (tmp_path / "compiled_kernels.json").write_text(json.dumps({hf.kernel_key(draft): {"1x4": won}}))
    exact = HFModel(tiny_bf16().model, None, name="tiny-bf16-6", compile=hf.INVARIANT)
    exact.steps._invariant_kind = hf.INVARIANT_DPBF16
    caches = draft.new_cache(), exact.new_cache()
    for tokens in (PROMPT, [9, 4, 33], [2, 40, 11, 7]):
        fast = draft.forward(caches[0], torch.tensor([tokens]), batch_invariant=False)
        assert torch.equal(fast, exact.forward(caches[1], torch.tensor([tokens])))
    assert draft.steps.kernel == "auto" and draft.steps.kernels == {(1, 4): hf.INVARIANT_DPBF16} and draft.compiles == 1
    # where our kernel cannot take every linear map, the variant is not offered (nor raced)
    monkeypatch.setattr(dpbf16, "routes_all", lambda model: False)
    assert "every linear map" in tiny_bf16().steps.offers(hf.INVARIANT_DPBF16)


@pytest.mark.parametrize("fast", ["dpbf16", hf.INVARIANT_DPBF16])
def test_a_fast_one_token_step_that_is_the_batch_invariant_one_is_not_timed_against_itself(
    kernel, tmp_path, monkeypatch, fast
):
    # where the fast step's own race kept the batch-invariant variant for one token, the two timings are of one
    # step: their difference is noise, and the steps are batch-invariant whatever it is
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    model = HFModel(tiny_bf16().model, None, name="tiny-bf16-6", compile=True)
    model.steps.kernels[(1, 1)] = fast
    monkeypatch.setattr(
        hf.CompiledSteps, "_time_one_token", lambda self, settings: {"auto": 1.0, hf.INVARIANT_DPBF16: 1.2}
    )
    assert model.steps._race_exact() is (fast == hf.INVARIANT_DPBF16)


@pytest.mark.slow  # compiles
def test_the_concat_form_makes_the_products_that_read_one_input_one(kernel, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    eager = tiny_bf16()
    want = eager.forward(eager.new_cache(), torch.tensor([PROMPT + [9, 4, 33]]))[:, -3:]
    counts = {}
    for kind in (hf.DPBF16, hf.DPBF16 + hf.CONCAT):
        model = tiny_bf16()
        model.compile, model.steps.kernel = True, kind
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
    assert model.steps.offers(hf.DPBF16) == "it multiplies bfloat16 on a CPU"
    monkeypatch.setattr(dpbf16, "_state", {})
    monkeypatch.setenv(dpbf16.VARIABLE, "0")
    assert tiny_bf16().steps.offers(hf.DPBF16) == "MULTISPEC_DPBF16=0"


def _attention_reference(query, keys, values, mask, scaling):
    """Softmax attention in float64 (grouped query heads)."""
    group = query.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, 1)
    v = values.double().repeat_interleave(group, 1)
    scores = query.double() @ k.transpose(-1, -2) * scaling + mask.double()
    return torch.softmax(scores, -1) @ v


def test_the_attention_is_softmax_attention_in_float32(kernel):
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 6, 5, 64, generator=gen).bfloat16()
    keys, values = torch.randn(2, 2, 90, 64, generator=gen), torch.randn(2, 2, 90, 33, generator=gen)
    mask = torch.zeros(2, 1, 5, 77)
    mask[1, :, :, 40:] = torch.finfo(torch.float32).min  # the second row sees 40 keys
    out = dpbf16.attend(query, keys, values, mask, 32, 0.125)  # the first 77 slots, the first 32 value columns
    assert out.shape == (2, 6, 5, 32) and out.dtype == torch.bfloat16
    exact = _attention_reference(query, keys[:, :, :77], values[:, :, :77, :32], mask, 0.125)
    assert torch.allclose(out.double(), exact, atol=1e-2, rtol=1e-2)
    out32 = dpbf16.attend(query.float(), keys, values, mask, 32, 0.125)
    assert torch.allclose(out32.double(), exact, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="multiples of 16"):
        dpbf16.attend(query[..., :40], keys[..., :40], values, mask, 32, 0.125)


@pytest.mark.parametrize(
    "heads, kv_heads, dim, tokens, past",
    [(9, 3, 64, 16, 1000), (9, 3, 64, 5, 37), (6, 2, 128, 7, 300), (4, 4, 64, 1, 20), (2, 1, 32, 3, 50)],
)
def test_each_attention_row_gets_the_bits_it_gets_alone(kernel, heads, kv_heads, dim, tokens, past):
    # the rows that share a key head are attended in blocks (their scores 16 keys at a time, a value loaded once
    # for the block), whose size follows the number of rows; each row's sums keep one order, so a row fed with
    # others gets the bits it gets alone, and softmax attention's value, from float32 or bfloat16 keys and values
    gen = torch.Generator().manual_seed(heads + tokens)
    width = past + tokens
    query = torch.randn(1, heads, tokens, dim, generator=gen).bfloat16()
    keys = torch.randn(1, kv_heads, width + 5, dim, generator=gen)
    values = torch.cat(
        [torch.randn(1, kv_heads, width + 5, dim, generator=gen), torch.ones(1, kv_heads, width + 5, 1)], -1
    )
    mask = torch.zeros(1, 1, tokens, width)
    mask[..., past:] = torch.where(torch.rand(tokens, tokens, generator=gen) < 0.5, torch.finfo(torch.float32).min, 0.0)
    mask[..., past:].diagonal(dim1=-2, dim2=-1).zero_()
    together = dpbf16.attend(query, keys, values, mask, dim, 0.125)
    exact = _attention_reference(query, keys[:, :, :width], values[:, :, :width, :dim], mask, 0.125)
    assert torch.allclose(together.double(), exact, atol=1e-2, rtol=1e-2)
    # a bfloat16 cache holding the same numbers (a bfloat16 model's keys and values are bfloat16) gives the same bits
    keys, values = keys.bfloat16().float(), values.bfloat16().float()
    together = dpbf16.attend(query, keys, values, mask, dim, 0.125)
    assert torch.equal(dpbf16.attend(query, keys.bfloat16(), values.bfloat16(), mask, dim, 0.125), together)
    group = heads // kv_heads
    for head in range(heads):
        kv = slice(head // group, head // group + 1)
        for token in range(tokens):
            alone = dpbf16.attend(
                query[:, head : head + 1, token : token + 1],
                keys[:, kv].bfloat16(),
                values[:, kv].bfloat16(),
                mask[:, :, token : token + 1],
                dim,
                0.125,
            )
            assert torch.equal(alone[0, 0, 0], together[0, head, token]), (head, token)


@pytest.mark.parametrize("dim, cache", [(64, torch.bfloat16), (128, torch.float32)])
def test_packed_tokens_each_get_the_bits_they_get_alone_over_their_own_row(kernel, dim, cache):
    # a batched step's tokens (`static.attend_packed`): each reads its own row of the batch cache through its own
    # mask row; its output is softmax attention, with the bits `attend` gives it alone, however wide the masks
    # are padded and whatever else is packed with it
    gen = torch.Generator().manual_seed(dim)
    rows, kv_heads, heads, capacity = 5, 3, 9, 300
    keys = torch.randn(rows, kv_heads, capacity, dim, generator=gen).to(cache)
    values = torch.randn(rows, kv_heads, capacity, dim + 1, generator=gen).to(cache)  # a ones column after dim
    token_rows = torch.tensor([0, 0, 0, 1, 2, 2, 3, 4, 4, 4, 4, 1])
    widths = torch.randint(50, 250, (len(token_rows),), generator=gen)
    minimum = torch.finfo(torch.float32).min
    mask = torch.full((len(token_rows), int(widths.max()) + 7), minimum)
    for t, w in enumerate(widths.tolist()):
        mask[t, :w] = 0.0
    query = torch.randn(len(token_rows), heads, dim, generator=gen).bfloat16()
    out = dpbf16.attend_tokens(query, keys, values, token_rows, mask, dim, 0.125)
    assert out.shape == (len(token_rows), heads, dim) and out.dtype == torch.bfloat16
    for t, (row, w) in enumerate(zip(token_rows.tolist(), widths.tolist(), strict=True)):
        alone = dpbf16.attend(
            query[t][None, :, None], keys[row][None], values[row][None], torch.zeros(1, 1, 1, w), dim, 0.125
        )
        assert torch.equal(alone[0, :, 0], out[t]), t
        exact = _attention_reference(
            query[t][None, :, None],
            keys[row][None, :, :w],
            values[row][None, :, :w, :dim],
            torch.zeros(1, 1, 1, w),
            0.125,
        )
        assert torch.allclose(out[t].double(), exact[0, :, 0], atol=1e-2, rtol=1e-2)
    wider = torch.cat([mask, torch.full((len(token_rows), 40), minimum)], 1)
    assert torch.equal(dpbf16.attend_tokens(query, keys, values, token_rows, wider, dim, 0.125), out)
    # the known-wrong variant: every token reading the first row, as one group's gathered copy would
    wrong = dpbf16.attend_tokens(query, keys, values, torch.zeros_like(token_rows), mask, dim, 0.125)
    assert not torch.equal(wrong, out)
    with pytest.raises(RuntimeError, match="a row out of range"):
        dpbf16.attend_tokens(query, keys, values, token_rows + rows, mask, dim, 0.125)
    with pytest.raises(RuntimeError, match="heads of 64 or 128"):
        dpbf16.attend_tokens(query[..., :32], keys[..., :32], values, token_rows, mask, 32, 0.125)


def _tree_and_chain(attention, past: int = 300):
    """A node at depth 3 of a tree (its ancestors at tree slots 0 and 2, a masked sibling at 1 and a cousin after
    it) against the same node as a chain step (ancestors at consecutive slots): whether its output has the same
    bits, and whether it does scored alone or with the tree's other nodes."""
    gen = torch.Generator().manual_seed(3)
    query = torch.randn(1, 6, 4, 64, generator=gen)
    prefix_k, prefix_v = torch.randn(1, 2, past, 64, generator=gen), torch.randn(1, 2, past, 64, generator=gen)
    new_k, new_v = torch.randn(1, 2, 4, 64, generator=gen), torch.randn(1, 2, 4, 64, generator=gen)
    minimum = torch.finfo(torch.float32).min
    # tree slots: 0 = node a (depth 1), 1 = sibling s, 2 = node b (child of a), 3 = node c (child of b)
    tree_k, tree_v = torch.cat([prefix_k, new_k], 2), torch.cat([prefix_v, new_v], 2)
    visible = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    mask = torch.zeros(1, 1, 4, past + 4)
    mask[..., past:] = torch.where(visible, 0.0, minimum)
    tree = attention(query, tree_k, tree_v, mask)[:, :, 3]
    # the chain: a, b, c at consecutive slots (the sibling is not in the cache)
    chain_k, chain_v = (
        tree_k[:, :, [*range(past), past, past + 2, past + 3]],
        tree_v[:, :, [*range(past), past, past + 2, past + 3]],
    )
    alone = attention(query[:, :, 3:], chain_k, chain_v, torch.zeros(1, 1, 1, past + 3))[:, :, 0]
    return torch.equal(tree, alone)


def test_the_attention_gives_a_tree_node_the_bits_of_a_chain_step(kernel):
    # every sum runs key after key from slot 0, and masked keys weigh exactly 0 and are skipped: a node's output
    # depends on the keys it sees, in order, not on the tree's other nodes between them
    def ours(query, keys, values, mask):
        return dpbf16.attend(query, keys, values, mask, values.shape[-1], 0.125)

    assert _tree_and_chain(ours) and _tree_and_chain(ours, past=1000)
    # the known-wrong variant: float32 products over all slots (the attention traced into the fast step), whose
    # sums meet other vector lanes in the tree than in the chain
    from multispec.models import static

    def traced(query, keys, values, mask):
        return static.attend_traced(query, keys, values, mask, 0.125, 0.0)

    if _tree_and_chain(traced) and _tree_and_chain(traced, past=1000):
        pytest.skip("this machine's float32 products give the same bits either way: the wrong variant shows nothing")


@pytest.mark.slow  # compiles
def test_batch_invariant_steps_on_our_kernels_hold_their_cache_in_bfloat16(kernel, tmp_path, monkeypatch):
    # where a target's steps attend through our kernel, its runner's cache holds bfloat16 (its keys and values are
    # bfloat16 numbers): half the bytes a step reads, and the logits a float32 cache gives, bit for bit
    from multispec.engine import ModelRunner
    from multispec.models import static

    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    monkeypatch.setattr(hf.compiled, "EXACT_TOLERANCE", 1e9)  # the batch-invariant steps, whatever they cost here
    model = HFModel(tiny_bf16().model, None, name="tiny-bf16-6", compile=True)
    raced = {"kernel": "dpbf16", "step_ms": {k: 1.0 for k in (*hf.VARIANTS, *hf.RACED)}}
    (tmp_path / "compiled_kernels.json").write_text(json.dumps({hf.kernel_key(model): {"1x1": raced, "1x4": raced}}))
    assert model.new_cache().key_buffers[0].dtype == torch.float32  # undecided: a draft's cache, say
    runner = ModelRunner(model)  # a target's runner decides the kernels before it makes its cache
    assert model.steps.kernel == hf.INVARIANT and model.steps.invariant_kind() == hf.INVARIANT_DPBF16
    assert {b.dtype for b in (*runner.cache.key_buffers, *runner.cache.value_buffers)} == {torch.bfloat16}
    wide = static.StaticKV(model.kv_shapes, model.dtype, model.device, storage=torch.float32)
    steps = [torch.tensor([PROMPT]), torch.tensor([[9]]), torch.tensor([[9, 4, 33]]), torch.tensor([[5, 1]])]
    for tokens in steps:
        half = model.forward(runner.cache, tokens, logits_to_keep=tokens.shape[1])
        assert torch.equal(half, model.forward(wide, tokens, logits_to_keep=tokens.shape[1]))
    assert torch.equal(runner.cache.held()[0][0].float(), wide.held()[0][0])
    # a float32 model keeps a float32 cache
    assert HFModel(tiny_llama(seed=6).model, None, compile=True).kv_storage() == torch.float32


@pytest.mark.slow  # compiles
@pytest.mark.parametrize("tolerance", [1e9, 0.0])
def test_compiled_steps_are_batch_invariant_where_that_costs_no_more_here(kernel, tmp_path, monkeypatch, tolerance):
    # compile=True: the first compiled step of a target times a one-token batch-invariant step on our kernels
    # against the fast one and keeps the outcome for the machine; a tolerance that no step can miss (or meet)
    # fixes the outcome here
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    monkeypatch.setattr(hf.compiled, "EXACT_TOLERANCE", tolerance)
    model = HFModel(tiny_bf16().model, None, name="tiny-bf16-6", compile=True)
    # the fast steps' kernels, as if an earlier process had raced them all (one compile each here, not a race)
    raced = {"kernel": "dpbf16", "step_ms": {k: 1.0 for k in (*hf.VARIANTS, *hf.RACED)}}
    (tmp_path / "compiled_kernels.json").write_text(json.dumps({hf.kernel_key(model): {"1x1": raced, "1x4": raced}}))
    # a draft's forwards (not batch-invariant: its logits decide nothing) leave it undecided
    cache = model.new_cache()
    model.forward(cache, torch.tensor([PROMPT]), batch_invariant=False)
    model.forward(cache, torch.tensor([[9]]), batch_invariant=False)
    assert model.steps._exact is None and model.steps.kernel == "auto"
    cache = model.new_cache()
    model.forward(cache, torch.tensor([PROMPT]))
    model.forward(cache, torch.tensor([[9, 4, 33]]))
    exact = tolerance > 1
    assert model.steps._exact is exact and (model.steps.kernel == hf.INVARIANT) is exact
    assert ((hf.INVARIANT_DPBF16, (1, 4)) in model.steps._packages) is exact
    store = json.loads((tmp_path / "compiled_kernels.json").read_text())
    (kept,) = [entry[hf.EXACT_CHOICE] for entry in store.values() if hf.EXACT_CHOICE in entry]
    assert kept["exact"] is exact and set(kept["step_ms"]) == {"auto", hf.INVARIANT_DPBF16}
    from multispec.api import describe_model

    assert describe_model(model).endswith("compiled, batch-invariant" if exact else "compiled")
    # a later process of the same weights takes the kept outcome without timing
    monkeypatch.setattr(hf.CompiledSteps, "_race_exact", lambda self: pytest.fail("raced again"))
    later = HFModel(tiny_bf16().model, None, name="tiny-bf16-6", compile=True)
    assert later.steps.resolve_kernel() == model.steps.kernel
