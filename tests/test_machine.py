"""Machine facts and per-thread settings (`multispec.machine`)."""

import threading

import pytest
import torch

from multispec import machine


def test_a_thread_set_to_one_thread_runs_alone_and_the_others_keep_theirs():
    if machine._openmp() is None:
        pytest.skip("torch's OpenMP here is not GNU's: the setting is a no-op")
    before = torch.get_num_threads()
    seen = {}

    def row():
        machine.one_thread_here()
        machine.one_thread_here()  # once per thread; again is a no-op
        seen["row"] = torch.get_num_threads()
        seen["sum"] = float(torch.ones(1_000_000).sum())  # a parallel-sized operator still runs, on this thread

    t = threading.Thread(target=row)
    t.start()
    t.join()
    assert seen == {"row": 1, "sum": 1_000_000.0}
    assert torch.get_num_threads() == before  # the calling thread's own setting is untouched


def test_a_measurement_that_did_not_hold_the_cpu_is_measured_again_and_reported_disturbed():
    import time

    calls = []

    def busy():
        calls.append(1)
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:  # holds the CPU the whole time
            pass
        return "busy"

    assert machine.undisturbed(busy) == ("busy", True) and len(calls) == 1

    def stopped():  # off the CPU most of the time, as a stopped or crowded-out process is
        calls.append(1)
        time.sleep(0.05)
        return "stopped"

    calls.clear()
    assert machine.undisturbed(stopped, attempts=3) == ("stopped", False) and len(calls) == 3


def test_a_kernel_race_run_while_the_process_was_off_the_cpu_is_not_kept_for_the_machine(monkeypatch, tmp_path):
    import time

    from multispec.models import linears
    from tests.conftest import tiny_llama

    model = tiny_llama(seed=7)
    if linears.packable(model.model) is not None:
        pytest.skip("no oneDNN packing here")
    store = tmp_path / "kernels.json"
    monkeypatch.setattr(linears, "_CHOICES", {})
    monkeypatch.setattr(linears, "kernel_store_path", lambda: store)
    race = linears._race

    def stopped_race(first, second):
        time.sleep(0.05)  # the worker was stopped while it timed them
        return race(first, second)

    monkeypatch.setattr(linears, "_race", stopped_race)
    model.forward(model.new_cache(), torch.tensor([[1, 2, 3]]))
    assert linears._CHOICES and "packed-linears" not in (store.read_text() if store.exists() else "")
    # undisturbed, the same race is kept
    monkeypatch.setattr(linears, "_CHOICES", {})
    monkeypatch.setattr(linears, "_race", race)
    again = tiny_llama(seed=7)
    again.forward(again.new_cache(), torch.tensor([[1, 2, 3]]))
    assert "packed-linears" in store.read_text()
