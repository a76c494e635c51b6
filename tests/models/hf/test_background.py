"""compile="auto" (`multispec.models.hf.background`): eager where compiled steps do not pay or are not made yet, a
real background worker that makes them (stopped while a generation runs, listed and ended by `multispec cache`),
and a later process that finds them and runs compiled without compiling anything."""

import time

import pytest
import torch

from multispec.api import describe_model, load_model
from multispec.entrypoints.cli import main
from multispec.models.hf import background, compiled
from tests.conftest import tiny_llama
from tests.models.helpers import PROMPT


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """This test's own cache (converted models, measurements, compiled steps, workers), and the policy it names."""
    root = tmp_path / "cache"
    monkeypatch.setenv("MULTISPEC_CACHE", str(root))
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(root / "forward_cost.json"))
    monkeypatch.setenv("MULTISPEC_COMPILE", "background")
    return root


@pytest.fixture()
def tiny_folder(tmp_path):
    # loaded in float32 throughout: the default dtype is bfloat16 on hosts with AVX512-BF16 or AMX
    folder = tmp_path / "tiny"
    tiny_llama(seed=3).model.save_pretrained(folder)
    return folder


def test_the_policy_is_read_and_a_bad_one_is_refused(monkeypatch):
    model = tiny_llama()  # float32
    monkeypatch.setenv("MULTISPEC_COMPILE", "eager")
    assert background.why_eager(model) == "MULTISPEC_COMPILE=eager"
    monkeypatch.setenv("MULTISPEC_COMPILE", "auto")
    assert "bfloat16" in background.why_eager(model)  # float32: compiled steps are not the default
    monkeypatch.setenv("MULTISPEC_COMPILE", "background")
    assert background.why_eager(model) is None
    monkeypatch.setenv("MULTISPEC_COMPILE", "sometimes")
    with pytest.raises(ValueError, match="MULTISPEC_COMPILE='sometimes': one of auto, eager, background"):
        background.why_eager(model)


def test_where_compiling_does_not_pay_auto_runs_eagerly_and_starts_no_worker(cache, tiny_folder, monkeypatch):
    monkeypatch.setenv("MULTISPEC_COMPILE", "auto")
    model = load_model(str(tiny_folder), dtype="float32")  # where compiled steps do not pay by default
    assert model.auto_compile and not model.compile
    assert background.workers() == []


@pytest.mark.parametrize("kind", ["tiles", "dpbf16"])
def test_a_target_whose_eager_layers_are_one_kernel_call_each_compiles_nothing(cache, tmp_path, monkeypatch, kind):
    # a Llama whose maps run on our kernel (the AMX tiles; the dot products of a CPU with AVX512-BF16 only, here
    # with the tiles turned off) steps through one kernel call per layer (`hf/lean.py`), about as fast as
    # compiled: "auto" runs it eagerly and starts no worker for it
    from multispec.models import dpbf16, linears
    from tests.models.helpers import _bf16_llama

    if dpbf16.unavailable() is not None:
        pytest.skip("our kernel does not run here (AVX512-BF16)")
    if kind == linears.TILES and not dpbf16.tiles_run():
        pytest.skip("no AMX tiles here")
    if kind == linears.DPBF16:
        monkeypatch.setenv(dpbf16.TILES_VARIABLE, "0")
    monkeypatch.setattr(linears, "_CHOICES", {})
    monkeypatch.setattr(linears, "_TILES", {})
    monkeypatch.setattr(linears, "GAIN", float("inf"))  # the tile kernel chosen whatever its race says
    folder = tmp_path / "bf16"
    _bf16_llama(hidden=576, intermediate=1536).model.save_pretrained(folder)
    monkeypatch.setenv("MULTISPEC_COMPILE", "auto")
    model = load_model(str(folder), dtype="bfloat16")
    assert model.auto_compile and not model.compile and not background.waiting(model)
    assert model.lean() is not None and set(model.lean().tiles) == {0x7F if kind == linears.TILES else 0}
    assert background.workers() == []
    monkeypatch.setenv("MULTISPEC_LEAN", "0")  # where its eager steps go through transformers' modules
    plain = load_model(str(folder), dtype="bfloat16", compile=False)
    assert not background.eager_as_fast(plain)


def test_a_failed_background_compile_is_not_started_again_on_every_run(cache, tiny_folder, capsys):
    status = background.status_path(str(tiny_folder), "target", torch.float32, torch.device("cpu"))
    background.write_status(status, model="tiny", role="target", pid=1 << 30, state="failed", error="it broke")
    model = load_model(str(tiny_folder), dtype="float32")
    assert not model.compile and not background.waiting(model)
    assert "its compiled steps could not be made here (it broke)" in capsys.readouterr().err
    assert [w["state"] for w in background.workers()] == ["failed"]  # no worker was started
    assert main(["cache"]) == 0
    assert "background compile  tiny (target)  failed  0 of 7 shapes: it broke" in capsys.readouterr().out


def test_a_measuring_command_compiles_in_its_own_process_and_only_while_it_loads(cache, tiny_folder, capsys):
    with background.foreground():  # what bench, tune, reproduce and cost-curve load their pair in
        model = load_model(str(tiny_folder), dtype="float32")
    assert model.compile and background.workers() == []  # its steps compile here, as it first needs them
    assert "compiled steps are made in this process, before anything is timed" in capsys.readouterr().err
    assert background.in_foreground is False


def test_a_generation_looks_for_workers_at_most_twice_a_second_and_at_once_after_one_starts(monkeypatch):
    # a look lists the workers' folder (a noticeable share of a short generation): after one that found none, the
    # next generations within LOOK_AGAIN seconds do not look, unless this process has just started a worker
    looks, stopped = [], []
    live = [[], [4242]]
    monkeypatch.setattr(background, "_live", lambda: looks.append(1) or live[min(len(looks), 2) - 1])
    monkeypatch.setattr(background, "_signal", lambda pids, sig: stopped.append(list(pids)) or list(pids))
    background.look_again()
    for _ in range(3):
        with background.paused():
            pass
    assert len(looks) == 1 and stopped[0] == []  # one look, none found
    background.look_again()  # as `spawn` does
    with background.paused():
        assert len(looks) == 2 and [4242] in stopped  # the new worker is stopped while the generation runs
    monkeypatch.setattr(background, "LOOK_AGAIN", 0.0)  # and without the pause between looks, every one looks
    with background.paused():
        pass
    assert len(looks) == 3


def test_eager_and_compile_flags_conflict():
    with pytest.raises(SystemExit, match="--eager and --compile"):
        main(["generate", "hi", "--eager", "--compile"])


def _wait(condition, seconds=30.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_first_run_is_eager_and_a_background_worker_makes_the_steps(cache, tiny_folder, capsys):
    model = load_model(str(tiny_folder), dtype="float32")
    assert model.auto_compile and not model.compile  # nothing is made yet: this process runs eagerly
    assert "its compiled steps are being made in the background" in capsys.readouterr().err
    assert describe_model(model).endswith("float32, eager until its compiled steps are made (in the background)")
    (worker,) = background.workers()
    pid = worker["pid"]
    assert worker["alive"] and worker["role"] == "target" and worker["source"] == str(tiny_folder)

    # another process of the same model finds it and starts no other
    again = load_model(str(tiny_folder), dtype="float32")
    assert not again.compile and "are being made in the background (" in capsys.readouterr().err
    assert len(background.workers()) == 1

    # while a generation runs, the worker (and the compiler it runs) is stopped, and goes on after
    with background.paused():
        assert _wait(lambda: background.process_state(pid) == "T")
    assert _wait(lambda: background.process_state(pid) not in ("T", None))

    # `multispec cache` shows it; --clear ends it and removes what it made
    assert main(["cache"]) == 0
    listed = capsys.readouterr().out
    assert f"background compile  {tiny_folder} (target)" in listed and "of 7 shapes" in listed
    assert main(["cache", "--clear"]) == 0
    assert f"stopped the background compile (process {pid})" in capsys.readouterr().out
    assert _wait(lambda: not background._alive(pid))
    assert not cache.exists() or not any(cache.iterdir())


@pytest.mark.slow
def test_once_every_step_is_made_a_later_process_runs_compiled_and_compiles_nothing(cache, tiny_folder, monkeypatch):
    # one bucket here (every bucket is made the same way; seven take minutes), and one kernel variant raced with its
    # concatenated form (the race is `test_kernels.py`'s): what the worker runs, in process
    monkeypatch.setattr(background, "BUCKETS", (1,))
    monkeypatch.setattr(compiled, "RACED", ("onednn",))
    from multispec.tools.prepare import prepare_model

    # a long-lived process (a server) that loaded the model before its steps were made; its worker is ended here,
    # and the steps are made in this process instead
    early = load_model(str(tiny_folder), dtype="float32")
    (worker,) = background.workers()
    background.stop_workers()
    assert _wait(lambda: not background._alive(worker["pid"]))
    before = early.new_cache()

    first = load_model(str(tiny_folder), dtype="float32", compile=True)
    assert background.missing(first, "target") == ["1 new token: its kernel choice"]
    made = prepare_model(first, "target")
    assert made["compiled"] >= 1 and made["missing"] == []

    later, eager = (
        load_model(str(tiny_folder), dtype="float32"),
        load_model(str(tiny_folder), dtype="float32", compile=False),
    )
    assert later.compile and not eager.compile and not any(w["alive"] for w in background.workers())
    cl, ce = later.new_cache(), eager.new_cache()
    later.forward(cl, torch.tensor([PROMPT]))
    eager.forward(ce, torch.tensor([PROMPT]))
    step = torch.tensor([[9]])
    assert torch.allclose(later.forward(cl, step), eager.forward(ce, step), atol=1e-4)
    assert later.compiles == 0  # loaded from the package the worker's run made

    # the early process runs compiled from its next generation; a cache made before stays eager
    assert not early.compile
    monkeypatch.setattr(background, "_checked", 0.0)
    background.switch_ready()
    assert early.compile and not before.compiled and early.new_cache().compiled


def test_cache_lists_and_clears_what_the_machine_keeps(cache, capsys):
    from multispec.models import packaged

    converted = cache / "some-model-f32"
    converted.mkdir(parents=True)
    (converted / "model.safetensors").write_bytes(b"x" * 3000)
    (cache / "forward_cost.json").write_text("{}")
    step = packaged.folder() / "abc" / "onednn-1x1.pt2"
    step.parent.mkdir(parents=True)
    step.write_bytes(b"x" * 1000)
    (step.parent / "key.json").write_text('{"key": "tiny|torch.float32|cpu|compiled|threads=2|weights=0"}')

    assert main(["cache"]) == 0
    listed = capsys.readouterr().out
    assert "converted model  some-model-f32" in listed and "measurements  forward_cost.json" in listed
    assert "1 compiled step(s)" in listed
    # the older name clears compiled steps only
    assert main(["compiled", "--clear"]) == 0 and "removed 1 compiled step(s)" in capsys.readouterr().out
    assert converted.exists() and not step.exists()
    assert main(["cache", "--clear"]) == 0
    assert "removed 0 compiled step(s), 0 MB, and 0 MB of measurements and converted models" in capsys.readouterr().out
    assert not converted.exists() and not (cache / "forward_cost.json").exists()
