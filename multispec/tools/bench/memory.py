"""Peak memory of one generation, above what was held when it started.

- CUDA: the caching allocator's peak (`max_memory_allocated` after `reset_peak_memory_stats`) minus the
  bytes allocated at the start: exact for tensors, blind to memory outside torch's allocator.
- CPU (and anything else): the process's resident set size, read by a thread every `interval` seconds;
  the peak reading minus the reading at the start. torch keeps no statistics for CPU tensors, so this
  is the measure left. It can under-read: memory the C allocator kept from earlier work is reused
  without growing the resident set, and a peak shorter than the interval can be missed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading

import psutil
import torch

INTERVAL = 0.002  # seconds between two readings of the resident set size


class PeakMemory:
    """`with PeakMemory(device) as peak: ...`, then `peak.bytes` (None if it could not be read)."""

    def __init__(self, device: str | torch.device = "cpu", interval: float = INTERVAL):
        self.device = torch.device(device)
        self.interval = interval
        self.bytes: int | None = None
        self.kind = "cuda allocator peak" if self.device.type == "cuda" else "resident set size peak"

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            return self
        _trim_heap()
        self._process = psutil.Process()
        self._start = self._peak = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, self._process.memory_info().rss)

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self._start
            return
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._process.memory_info().rss)
        self.bytes = self._peak - self._start


def _trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim), so that memory freed by
    earlier work is not silently reused and the resident set grows with what this generation holds."""
    if not sys.platform.startswith("linux"):
        return
    name = ctypes.util.find_library("c")
    if name:
        try:
            ctypes.CDLL(name).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
            pass
