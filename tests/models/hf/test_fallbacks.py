"""A compiled step that fails falls back for its own generation only: the shared model stays as it was, so one
failing request changes neither the speed nor the tokens of the next (a server's requests share one model)."""

from multispec import generate
from multispec.models.hf import CompiledSteps, HFModel
from tests.conftest import tiny_llama


def test_a_failed_compiled_step_falls_back_for_its_generation_only(monkeypatch):
    net = tiny_llama(seed=3).model
    compiled = HFModel(net, None, name="tiny-compiled", compile="fast")
    eager = HFModel(net, None, name="tiny-eager")
    attempts = []

    def failing(self, *args):  # the failure injected: every compiled step raises, as a broken compile would
        attempts.append(args[0].shape)
        raise RuntimeError("injected compile failure")

    monkeypatch.setattr(CompiledSteps, "run", failing)
    want = generate(eager, None, [1, 2, 3], method="ar", temperature=0, max_new_tokens=6, score=False).token_ids
    for _ in range(2):  # the second generation tries its compiled steps again
        before = len(attempts)
        out = generate(compiled, None, [1, 2, 3], method="ar", temperature=0, max_new_tokens=6, score=False)
        assert out.token_ids == want  # the generation finished, eagerly
        assert len(attempts) == before + 1  # one try, then the rest of this generation ran eagerly
        assert len(out.stats["fallbacks"]) == 1 and "injected compile failure" in out.stats["fallbacks"][0]
        assert compiled.compile  # the model itself is unchanged


def test_a_generation_without_failures_reports_no_fallback():
    out = generate(tiny_llama(seed=3), None, [1, 2, 3], method="ar", temperature=0, max_new_tokens=4, score=False)
    assert out.stats["fallbacks"] == []
