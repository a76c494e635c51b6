"""Stored cost curves (`multispec.models.cost`) and compiles inside a call: one-time costs, not decoding."""

import json

import pytest

from multispec import generate
from tests.conftest import tiny_llama
from tests.models.helpers import PROMPT


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    # compiled steps are kept on disk beside the cost file: each test has its own folder, so that none loads a
    # step another test compiled
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))


@pytest.mark.slow
def test_compiles_during_a_call_count_as_one_time_not_as_decoding(tmp_path, monkeypatch):
    # gamma=auto reads stored cost curves (no calibration), so the compiled steps' graphs are made inside the
    # call: their seconds (the process's first torch.compile included) are one-time costs, outside the target's
    # forward seconds and the controller's decoding speed
    from multispec.models.cost import _COSTS, COST_CONTEXTS, COST_TOKENS, cost_key

    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    target, draft = tiny_llama(seed=11), tiny_llama(seed=12, layers=1)
    curves = {}
    for model, seconds in ((target, 0.01), (draft, 0.002)):
        model.compile, model.steps.kernel = True, "onednn"
        _COSTS.pop(cost_key(model), None)
        curves[cost_key(model)] = {
            "contexts": list(COST_CONTEXTS),
            "tokens": list(COST_TOKENS),
            "seconds": [[seconds] * len(COST_TOKENS)] * len(COST_CONTEXTS),
        }
    (tmp_path / "forward_cost.json").write_text(json.dumps(curves))
    out = generate(target, draft, PROMPT, method="sd:gamma=auto", max_new_tokens=24, temperature=0)
    st = out.stats
    assert st["compiles"] >= 2 and st["one_time_seconds"] > 1.0  # graphs were made inside the call
    assert st["target_seconds"] + st["draft_seconds"] <= st["seconds"]
    assert st["decode_seconds"] <= st["seconds"]
    for model in (target, draft):
        _COSTS.pop(cost_key(model), None)
