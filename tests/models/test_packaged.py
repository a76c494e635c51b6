"""Compiled steps kept on disk (`multispec.models.packaged`): loaded for their own weights only, made again when
damaged, removed past the size limit, listed and cleared when stale."""

import json
from pathlib import Path

import pytest
import torch

from multispec.models import packaged, static
from tests.conftest import tiny_llama
from tests.models.helpers import PROMPT


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    # compiled steps are kept on disk beside the cost file: each test has its own folder, so that none loads a
    # step another test compiled
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))


@pytest.mark.slow
def test_a_compiled_step_is_kept_on_disk_for_its_own_weights_and_a_damaged_one_is_made_again(
    tmp_path, capsys, monkeypatch
):
    # a later process loads the step compiled by an earlier one (nothing compiled); a model of another
    # checkpoint under the same name does not get it; a damaged package is compiled again
    def run(seed, name="tiny"):
        eager, compiled = tiny_llama(seed=seed), tiny_llama(seed=seed)
        compiled.name, compiled.compile, compiled.steps.kernel = name, True, "onednn"
        ce, cc = eager.new_cache(), compiled.new_cache()
        eager.forward(ce, torch.tensor([PROMPT]))
        compiled.forward(cc, torch.tensor([PROMPT]))
        for tokens in ([9, 4], [33, 21]):
            step = torch.tensor([tokens])
            assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
        return compiled.compiles

    stale = put_package("older", "tiny|torch.float32|cpu|compiled|threads=2|weights=0")  # no step version
    assert run(seed=9) == 1
    assert not stale.exists() and "removed 1 compiled step(s) of an older graph" in capsys.readouterr().err
    (package,) = (tmp_path / "compiled").rglob("onednn-1x2.pt2")
    assert run(seed=9) == 0 and "loaded the compiled step of tiny" in capsys.readouterr().err
    assert run(seed=10) == 1  # same name and architecture, other weights
    assert len(list((tmp_path / "compiled").rglob("*.pt2"))) == 2
    package.write_bytes(b"not a package")
    assert run(seed=9) == 1

    # past the size limit, a compile removes the least recently used packages (seed 10's, then seed 9's)
    from multispec.entrypoints.cli import main

    size = package.stat().st_size
    monkeypatch.setenv("MULTISPEC_COMPILED_LIMIT_GB", str(1.5 * size / 1e9))
    capsys.readouterr()
    assert run(seed=11) == 1
    assert "removed 2 least recently used compiled step(s)" in capsys.readouterr().err
    (kept,) = (tmp_path / "compiled").rglob("*.pt2")
    assert run(seed=11) == 0
    assert main(["compiled"]) == 0
    listed = capsys.readouterr().out
    assert "1 compiled step(s)" in listed and "tiny  torch.float32  onednn-1x2" in listed
    assert main(["compiled", "--clear"]) == 0 and "removed 1 compiled step(s)" in capsys.readouterr().out
    assert not list((tmp_path / "compiled").iterdir())
    monkeypatch.setenv("MULTISPEC_COMPILED_LIMIT_GB", "lots")
    with pytest.raises(ValueError, match="MULTISPEC_COMPILED_LIMIT_GB='lots': give the gigabytes"):
        run(seed=11)


def put_package(folder: str, key: str) -> Path:
    """A file where a compiled step of `key` would be kept (not a package: enough to list and remove)."""
    path = packaged.folder() / folder / "onednn-1x1.pt2"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * 1000)
    (path.parent / "key.json").write_text(json.dumps({"key": key}))
    return path


def test_steps_of_another_compiled_graph_are_listed_stale_and_cleared(capsys):
    from multispec.entrypoints.cli import main

    now = put_package("now", f"tiny|torch.float32|cpu|compiled|threads=2|step={static.STEP_VERSION}|weights=0")
    old = put_package("old", "tiny|torch.float32|cpu|compiled|threads=2|weights=0")
    older = put_package("older", f"tiny|torch.float32|cpu|compiled+invariant|step={static.STEP_VERSION - 1}|weights=0")
    assert [p["stale"] for p in sorted(packaged.packages(), key=lambda p: str(p["path"]))] == [False, True, True]
    assert main(["compiled"]) == 0
    listed = capsys.readouterr().out
    assert "3 compiled step(s)" in listed and listed.count("stale") == 2
    assert main(["compiled", "--clear", "--stale"]) == 0
    assert "removed 2 compiled step(s)" in capsys.readouterr().out
    assert now.exists() and not old.exists() and not older.exists()
    assert packaged.prune_stale() == []


def test_the_weights_fingerprint_follows_the_weights_not_the_folder_they_came_from(tmp_path):
    from transformers import AutoModelForCausalLM

    tiny_llama(seed=3).model.save_pretrained(tmp_path / "a")
    tiny_llama(seed=3).model.save_pretrained(tmp_path / "b")
    tiny_llama(seed=4).model.save_pretrained(tmp_path / "c")
    a, b, c = (AutoModelForCausalLM.from_pretrained(tmp_path / n) for n in "abc")
    assert a.config._name_or_path != b.config._name_or_path
    assert packaged.weights_fingerprint(a) == packaged.weights_fingerprint(b)
    assert packaged.weights_fingerprint(a) != packaged.weights_fingerprint(c)  # other weights
    b.config.rms_norm_eps = 1e-3
    assert packaged.weights_fingerprint(a) != packaged.weights_fingerprint(b)  # another configuration
