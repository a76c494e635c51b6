"""Kernel variants of the compiled steps (`multispec.models.hf.kernels`) on tiny random Llamas: each shape keeps the
variant that ran fastest here, the concatenated products, the stored choices."""

import json
from pathlib import Path

import pytest
import torch

from multispec.models import hf
from tests.conftest import tiny_llama
from tests.models.helpers import PROMPT


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    # compiled steps are kept on disk beside the cost file: each test has its own folder, so that none loads a
    # step another test compiled
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))


@pytest.mark.slow
def test_each_compiled_shape_keeps_the_kernel_variant_that_ran_fastest_here(tmp_path, monkeypatch, capsys):
    # first use of a shape on a machine: the step is compiled in every variant, each timed whole in place, and
    # the fastest kept (stored for the machine, with every timing)
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    eager, compiled = tiny_llama(seed=6), tiny_llama(seed=6)
    compiled.compile = True
    assert compiled.steps.kernel == "auto"
    ce, cc = eager.new_cache(), compiled.new_cache()
    eager.forward(ce, torch.tensor([PROMPT]))
    compiled.forward(cc, torch.tensor([PROMPT]))
    for tokens in ([9, 4, 33], [2, 40, 11]):
        step = torch.tensor([tokens])
        assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
    # a graph per variant of KERNELS that runs here (our bfloat16 kernel does not take float32), one more for the
    # faster with its products concatenated; none after the choice
    assert compiled.steps.offers(hf.DPBF16) == "it multiplies bfloat16 on a CPU"
    assert compiled.compiles == len(hf.KERNELS) - 1 + 1 == 3
    kept = compiled.steps.kernels[(1, 4)]
    assert kept in hf.VARIANTS
    err = capsys.readouterr().err
    assert "(onednn kernels)" in err and "(autotuned kernels)" in err and f"keeps {kept}" in err
    # (the store also holds machine-wide choices, such as the packed linear maps', when this process made them here)
    entry = json.loads((tmp_path / "compiled_kernels.json").read_text())[hf.kernel_key(compiled)]
    timed = set(entry["1x4"]["step_ms"])
    (concat,) = timed - set(hf.KERNELS)
    assert entry["1x4"]["kernel"] == kept and timed == {*hf.KERNELS, concat} - {hf.DPBF16}
    assert concat.removesuffix(hf.CONCAT) in hf.KERNELS and f"({concat} kernels)" in err
    assert entry["1x4"]["step_ms"][kept] == min(entry["1x4"]["step_ms"].values())  # the faster one is kept
    # later steps run the kept variant's graph and match
    step = torch.tensor([[7, 1, 30]])
    assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
    # only the kept variant's compiled step stays on disk
    assert [p.name for p in (tmp_path / "compiled").rglob("*.pt2")] == [f"{kept}-1x4.pt2"]
    # another process on this machine (here: a fresh model of the same weights) loads it and compiles nothing
    again = tiny_llama(seed=6)
    again.compile = True
    ca = again.new_cache()
    again.forward(ca, torch.tensor([PROMPT]))
    want = eager.forward(eager.new_cache(), torch.tensor([PROMPT + [9, 4, 33]]))[:, -3:]
    assert torch.allclose(again.forward(ca, torch.tensor([[9, 4, 33]])), want, atol=1e-4)
    assert again.compiles == 0 and again.steps.kernels == {(1, 4): kept}
    assert (
        f"loaded the compiled step of tiny-llama-64-6 for 1 x 4 new tokens ({kept} kernels)" in capsys.readouterr().err
    )


def _products(package: Path) -> int:
    """Matrix products (oneDNN linear maps) the packaged step's generated code calls."""
    import re
    import zipfile

    with zipfile.ZipFile(package) as z:
        source = "".join(z.read(n).decode() for n in z.namelist() if n.endswith("wrapper.cpp"))
    return len(re.findall(r"aoti_torch_cpu__linear_pointwise\w*\(", source))


@pytest.mark.slow
def test_the_concat_variant_makes_the_products_that_read_one_input_one(tmp_path, monkeypatch):
    # a layer's query, key and value maps become one product, its gate and up maps another: 7 products a layer
    # and the head -> 4 a layer and the head; the logits stay the eager step's
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    eager = tiny_llama(seed=6)
    want = eager.forward(eager.new_cache(), torch.tensor([PROMPT + [9, 4, 33]]))[:, -3:]
    counts = {}
    for kind in ("onednn", "onednn" + hf.CONCAT):
        model = tiny_llama(seed=6)
        model.compile, model.steps.kernel = True, kind
        cache = model.new_cache()
        model.forward(cache, torch.tensor([PROMPT]))
        assert torch.allclose(model.forward(cache, torch.tensor([[9, 4, 33]])), want, atol=1e-4)
        (package,) = (tmp_path / "compiled").rglob(f"{kind}-1x4.pt2")
        counts[kind] = _products(package)
    assert counts == {"onednn": 2 * 7 + 1, "onednn+concat": 2 * 4 + 1}
    with pytest.raises(ValueError, match="one of onednn, autotuned, dpbf16, onednn"):
        hf.kernel_options("concat")


def test_a_stored_choice_of_an_unknown_variant_is_made_again_and_a_bad_kernel_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    model = tiny_llama(seed=8)
    model.compile = True
    (tmp_path / "compiled_kernels.json").write_text(json.dumps({hf.kernel_key(model): {"1x1": {"kernel": "gone"}}}))
    assert hf.stored_choice(model, (1, 1)) is None and hf.stored_choice(model, (1, 2)) is None
    model.steps.kernel = "fastest"
    cache = model.new_cache()
    model.forward(cache, torch.tensor([PROMPT]))
    with pytest.raises(ValueError, match="kernel 'fastest': 'auto', 'invariant' or one of onednn, autotuned"):
        model.forward(cache, torch.tensor([[9]]))


def _store(tmp_path, model, entries: dict) -> None:
    (tmp_path / "compiled_kernels.json").write_text(json.dumps({hf.kernel_key(model): entries}))


def test_a_bucket_between_the_ends_follows_their_race_where_both_kept_one_variant(tmp_path):
    from multispec.models.hf import store

    model = tiny_llama(seed=8)
    model.compile = True
    raced = {"step_ms": {"onednn": 1.0, "autotuned": 1.2}}
    _store(tmp_path, model, {"1x1": {"kernel": "onednn+concat", **raced}, "1x64": {"kernel": "onednn+concat", **raced}})
    follows = store.choice(model, (1, 8))
    assert follows == {"kernel": "onednn+concat", "from": ["1x1", "1x64"]}
    assert model.steps._untried(follows) == []  # not raced again for variants its ends lacked
    assert store.choice(model, (1, 1))["step_ms"] == raced["step_ms"]  # an end is its own race
    assert store.choice(model, (2, 8)) is None  # other rows: other ends
    # a kept variant without its concatenated form races against that form (it may win only between the ends)
    _store(tmp_path, model, {"1x1": {"kernel": "onednn", **raced}, "1x64": {"kernel": "onednn", **raced}})
    assert store.choice(model, (1, 8)) is None and store.candidates(model, (1, 8)) == ["onednn"]
    # the ends disagree: the bucket races their two variants; one end not raced yet: every variant
    _store(tmp_path, model, {"1x1": {"kernel": "onednn", **raced}, "1x64": {"kernel": "autotuned+concat", **raced}})
    assert store.choice(model, (1, 8)) is None and store.candidates(model, (1, 8)) == ["onednn", "autotuned+concat"]
    assert model.steps._untried({"kernel": "onednn", "step_ms": {}, "among": ["onednn", "autotuned"]}) == []
    _store(tmp_path, model, {"1x1": {"kernel": "onednn", **raced}})
    assert store.choice(model, (1, 8)) is None and store.choice(model, (1, 64)) is None
    assert store.candidates(model, (1, 8)) is None and store.candidates(model, (1, 1)) is None
    # a bucket's own race stands whatever the ends kept
    own = {"kernel": "autotuned", **raced}
    _store(tmp_path, model, {"1x1": {"kernel": "onednn", **raced}, "1x64": {"kernel": "onednn", **raced}, "1x8": own})
    assert store.choice(model, (1, 8)) == own
    # the worker makes the ends first
    from multispec.models.hf import background

    assert background.BUCKETS[:2] == (1, hf.COMPILED_TOKENS) and sorted(background.BUCKETS[2:]) == [2, 4, 8, 16, 32]


@pytest.mark.slow
def test_a_bucket_between_raced_ends_compiles_only_their_variants(tmp_path):
    # where both ends' races kept one variant, a bucket between them compiles that variant alone: one whole-model
    # compile instead of a race of several; where they kept two, it races those two alone
    eager, model = tiny_llama(seed=6), tiny_llama(seed=6)
    model.compile = True
    raced = {"step_ms": {"onednn": 1.0, "autotuned": 1.2}}
    _store(tmp_path, model, {"1x1": {"kernel": "onednn+concat", **raced}, "1x64": {"kernel": "onednn+concat", **raced}})
    ce, cc = eager.new_cache(), model.new_cache()
    eager.forward(ce, torch.tensor([PROMPT]))
    model.forward(cc, torch.tensor([PROMPT]))
    step = torch.tensor([[9, 4, 33]])
    assert torch.allclose(model.forward(cc, step), eager.forward(ce, step), atol=1e-4)
    assert model.compiles == 1 and model.steps.kernels == {(1, 4): "onednn+concat"}
    assert [p.name for p in (tmp_path / "compiled").rglob("*.pt2")] == ["onednn+concat-1x4.pt2"]
    assert "1x4" not in json.loads((tmp_path / "compiled_kernels.json").read_text())[hf.kernel_key(model)]
    entries = json.loads((tmp_path / "compiled_kernels.json").read_text())[hf.kernel_key(model)]
    entries["1x64"] = {"kernel": "autotuned+concat", **raced}
    _store(tmp_path, model, entries)
    step = torch.tensor([[5, 8]])
    assert torch.allclose(model.forward(cc, step), eager.forward(ce, step), atol=1e-4)
    entry = json.loads((tmp_path / "compiled_kernels.json").read_text())[hf.kernel_key(model)]["1x2"]
    assert entry["among"] == ["onednn+concat", "autotuned+concat"] and set(entry["step_ms"]) == set(entry["among"])
    assert model.compiles == 1 + 2 and model.steps.kernels[(1, 2)] == entry["kernel"]
