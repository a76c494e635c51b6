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
