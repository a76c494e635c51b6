"""Facts about the machine that runs us, and the per-machine stores where measurements and choices made here are
kept (cost curves, compiled-kernel choices, compiled packages). The ground floor: it imports nothing of ours."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

T = TypeVar("T")


def cache_dir() -> Path:
    """Where this machine's converted models, measurements and compiled steps are kept (`MULTISPEC_CACHE`, default
    ~/.cache/multispec)."""
    root = os.environ.get("MULTISPEC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "multispec")
    return Path(root)


# one-time seconds this process spent measuring the machine (cost curves, kernel calibration), not decoding
calibration_seconds = 0.0


def store_path() -> Path:
    """The cost-curve store; the other stores sit beside it. MULTISPEC_COST_FILE names another file (the test
    suite keeps its curves, measured on a busy machine, out of the user's)."""
    return Path(os.environ.get("MULTISPEC_COST_FILE") or cache_dir() / "forward_cost.json")


def kernel_store_path() -> Path:
    """The store of compiled-kernel choices, per-shape races and checks made on this machine."""
    return store_path().with_name("compiled_kernels.json")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo's "flags", or "Features" on ARM; empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            line = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return frozenset()
    return frozenset(line.split(":", 1)[1].split()) if ":" in line else frozenset()


def instruction_sets() -> str:
    """A short hash of the CPU's feature flags: hosts sold under one model name differ (one "AMD EPYC" here
    had AVX-512 and bfloat16 instructions, the next only AVX2), and both timings and compiled code are
    specific to them."""
    import platform

    text = " ".join(sorted(cpu_flags())) or platform.machine()
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def describe_device(device) -> str:
    """The device in words: the GPU's name, or the CPU's model and cores."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    import platform

    model, flags = "", cpu_flags()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    # one model name covers hosts with and without AVX-512 and bfloat16 instructions: name what this one has
    vector = torch.backends.cpu.get_cpu_capability()
    bf16 = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    isa = f"{vector}" + (f" + {' + '.join(bf16)}" if bf16 else "")
    return f"cpu ({model or platform.processor() or platform.machine()}, {isa}, {torch.get_num_threads()} threads)"


def read_store(path: Path) -> dict:
    """A per-machine JSON store (cost curves, compiled-kernel choices): {} when absent or unreadable."""
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_store_entry(path: Path, key: str, entry) -> None:
    """Set one key of a per-machine JSON store; a read-only home keeps the measurement for this process only."""
    data = read_store(path)
    data[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
    except OSError:
        pass


_ONE_THREAD = threading.local()


# a measurement during which this process held a CPU for less than this share of the wall time was stopped or
# crowded out (a background compile worker, niced and stopped while a generation runs): its timings are not the
# machine's. Every thread counts: a parallel pass holds up to one CPU per thread.
CPU_SHARE = 0.5
SHORTEST_JUDGED = 0.01  # seconds: the CPU clock may tick coarser than a shorter measurement (a stop lengthens it)


def undisturbed(measure: Callable[[], T], attempts: int = 3) -> tuple[T, bool]:
    """Run `measure()` (a timing of this machine) until it ran without being stopped or crowded out (`CPU_SHARE`),
    at most `attempts` times.

    Returns:
        (its last result, whether that run was undisturbed): a disturbed result may serve this process, but is
        not a fact about the machine, so it is never stored (a stored choice made from it would stay, and the
        kernels it picked run several times slower: docs/decisions.md).
    """
    for _ in range(attempts):
        wall, cpu = time.perf_counter(), time.process_time()
        out = measure()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if wall < SHORTEST_JUDGED or cpu >= CPU_SHARE * wall:
            return out, True
    return out, False


def one_thread_here() -> None:
    """From now on, torch's CPU operators called from this thread run on it alone (OpenMP's setting for this
    thread only; the others keep theirs). For threads that do little tensor work beside the thread that runs the
    models (a batch's rows): under GNU OpenMP, one parallel region begun on such a thread leaves a team of
    workers that outnumber the cores, after which every region of every thread wakes its workers from sleep.
    On a 2-core host, one row thread's region made the main thread's steps take twice as long. A no-op where
    torch's OpenMP is not GNU's, or where it cannot be found."""
    if getattr(_ONE_THREAD, "done", False):
        return
    _ONE_THREAD.done = True
    library = _openmp()
    if library is not None:
        torch.get_num_threads()  # torch sets this thread's OpenMP threads on its first use: before ours
        library.omp_set_num_threads(1)


@functools.cache
def _openmp():
    """The GNU OpenMP library loaded in this process (torch's own copy), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = sorted({line.split()[-1] for line in f if "libgomp" in line and "/" in line})
    except OSError:
        return None
    for path in paths:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None
