"""Compiled steps by default, with a bounded first use (`compile="auto"`, what every entry point takes unless told).

Compiling a model's steps takes many minutes the first time on a machine: one graph per bucket of new tokens,
each raced in several kernel variants (`compiled.py`). A first run should not wait for that, and a later one
should not pay it again. So, per process and per model:

- where a target's eager steps are about as fast as compiled ones (a Llama whose layers run one kernel call
  each on a CPU with AMX, `eager_as_fast`), it runs eagerly and nothing is compiled for it;
- where compiled steps pay (a CPU with AVX512-BF16 or AMX, in bfloat16) and every bucket's step of this model is
  already packaged on this machine, the model runs compiled: its packages load in seconds;
- where they pay but some are missing, the model runs eagerly in this process, and a compile worker is started
  in the background (a separate, lower-priority process: `multispec compile --background`) that compiles and
  packages every bucket, exactly as `--compile` would; the next process finds them and runs compiled;
- elsewhere (no fast bfloat16, float32, a model without a static cache, CUDA, whose eager steps are captured in
  CUDA graphs anyway) it runs eagerly.

A process never mixes eager and compiled steps of one model: a greedy speculative method's tokens then stay equal
to greedy `ar`'s wherever the steps are batch-invariant, and the cost curves gamma=auto reads stay those of the
engine that runs. Workers run one at a time (a lock), and `multispec cache` shows what one is doing.
MULTISPEC_COMPILE overrides the choice: `eager` (never compile by default), `background` (compile in the
background wherever the model can be compiled, fast bfloat16 or not)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...console import note
from ...machine import cache_dir, cpu_flags
from .. import dpbf16, linears, packaged
from ..static import bucket
from . import store
from .kernels import COMPILED_TOKENS, EXACT_CHOICE, INVARIANT, INVARIANT_DPBF16, has_fast_bfloat16

if TYPE_CHECKING:
    from .model import HFModel

AUTO = "auto"
POLICY_VARIABLE = "MULTISPEC_COMPILE"
POLICIES = ("auto", "eager", "background")
# the buckets of new tokens a compiled model steps in (one row): all of them are compiled before a process uses any;
# the two ends first, so that the buckets between them can follow their races (`store.choice`)
BUCKETS = tuple(
    sorted(
        (1 << i for i in range(COMPILED_TOKENS.bit_length()) if 1 << i <= COMPILED_TOKENS),
        key=lambda w: 1 < w < COMPILED_TOKENS,
    )
)
ROLES = ("target", "draft")
# within `foreground()` (the commands that measure: bench, tune, reproduce, cost-curve), "auto" compiles what is
# missing in this process, before anything is timed, instead of in a worker running beside the measurement
in_foreground = False


@contextlib.contextmanager
def foreground():
    global in_foreground
    before, in_foreground = in_foreground, True
    try:
        yield
    finally:
        in_foreground = before


def policy() -> str:
    """MULTISPEC_COMPILE: what `compile="auto"` does (`auto`, `eager` or `background`; default `auto`)."""
    text = os.environ.get(POLICY_VARIABLE, "").strip().lower() or "auto"
    if text not in POLICIES:
        raise ValueError(f"{POLICY_VARIABLE}={text!r}: one of {', '.join(POLICIES)}")
    return text


def why_eager(hf: HFModel) -> str | None:
    """None where `compile="auto"` compiles this model's steps here, else why it runs them eagerly."""
    chosen = policy()
    if chosen == "eager":
        return f"{POLICY_VARIABLE}=eager"
    if not hf.static:
        return "it keeps transformers' dynamic cache"
    if hf.device.type != "cpu":
        return f"on {hf.device.type} its eager steps are what runs by default" + (
            " (captured in CUDA graphs)" if hf.graphs else ""
        )
    if not hf.steps.packaging():
        return "its compiled steps are not kept on disk here (MULTISPEC_KEEP_COMPILED=0, or spread over devices)"
    if chosen == "background":
        return None
    if not has_fast_bfloat16(hf.device) or hf.dtype != torch.bfloat16:
        return "compiled steps pay on CPUs with bfloat16 instructions (AVX512-BF16 or AMX), in bfloat16"
    return None


def eager_as_fast(hf: HFModel) -> bool:
    """Whether `hf`'s eager steps run one kernel call per layer here (`lean.py`: a Llama whose linear maps won
    their race on our kernel, the AMX tiles or the AVX512-BF16 dot products), which decode about as fast as its
    compiled steps: then `compile="auto"` runs it eagerly and compiles nothing for it (the measurements behind
    this: docs/decisions.md). Settles the model's linear maps (a race of about a second)."""
    from .lean import FAMILIES

    if type(hf.model).__name__ not in FAMILIES or linears.ours() is None:
        return False  # (no packing, and no race, for a model that compiles anyway)
    return hf.rows_packed() and hf.lean() is not None


def missing(hf: HFModel, role: str) -> list[str]:
    """What this machine still lacks for `hf` to run compiled in `role` (target or draft) with no compile in this
    process, as `compile=True` would run it: each a few words; [] when every bucket's step is packaged here."""
    from .compiled import CompiledSteps

    if hf.device.type == "cpu" and hf.dtype == torch.bfloat16 and "avx512_bf16" in cpu_flags() and not dpbf16.built():
        # our kernel is built first (a compile of its own, which only a worker or --compile pays for); the steps'
        # kernel choices depend on it
        return ["our bfloat16 kernel"]
    hf = _Compiled(hf)  # keys name the compiled engine; nothing is decided on the model itself
    steps = hf.steps = CompiledSteps(hf, "auto", exact=None)
    lacking = []
    kernel = "auto"
    if role == "target" and steps.exact_eligible():
        kept = store.stored_entry(steps.package_key(), EXACT_CHOICE)
        if not isinstance((kept or {}).get("exact"), bool):
            return ["the choice between batch-invariant and fast steps"]
        if kept["exact"]:
            kernel = steps.kernel = INVARIANT
            steps._invariant_kind = INVARIANT_DPBF16
    storage = type(hf._hf).kv_storage(hf)  # (the model's own rule, read through the compiled view)
    for width in BUCKETS:
        shape, tokens = (1, width), f"{width} new token{'s' if width > 1 else ''}"
        if kernel == INVARIANT:
            kind = INVARIANT_DPBF16
        else:
            entry = store.choice(hf, shape)
            if entry is None or steps.offers(entry["kernel"]) is not None or steps._untried(entry):
                lacking.append(f"{tokens}: its kernel choice")
                continue
            kind = entry["kernel"]
        stored = steps.stored_name(kind, storage)
        if not packaged.path_for(steps.package_key(), stored, shape).exists():
            lacking.append(f"{tokens}: its compiled step")
        elif kernel == INVARIANT and width > bucket(1) and store.stored_check(hf, width) is None:
            lacking.append(f"{tokens}: its invariance check")
    return lacking


class _Compiled:
    """`hf` seen as compiled (what the kernel store's and the packages' keys read of a model), with steps of its
    own."""

    compile = True

    def __init__(self, hf):
        self._hf = hf

    def __getattr__(self, name):
        return getattr(self._hf, name)


def settle(hf: HFModel, role: str) -> None:
    """Decide `compile="auto"` for this process (see the module): compiled where every step is packaged here,
    else eagerly, with a background worker started where compiling pays."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}: one of {', '.join(ROLES)}")
    if why_eager(hf) is not None:
        return
    if role == "target" and eager_as_fast(hf):
        return
    if not missing(hf, role):
        hf.enable_compile()
        return
    if in_foreground:
        wait_for_workers()
        hf.enable_compile()  # its steps compile as it first needs them (a bench's warm-up)
        note(f"multispec: {hf.name}'s compiled steps are made in this process, before anything is timed")
        return
    if getattr(hf, "source", None) is None:
        note(f"multispec: {hf.name} runs eagerly (it was not loaded from a name or folder a worker could load)")
        return
    running = worker_for(hf, role)
    if running is not None:
        _waiting.append((weakref.ref(hf), role))  # compiled from its next generation once they are made
        note(
            f"multispec: {hf.name} runs eagerly: its compiled steps are being made in the background "
            f"({running.get('done', 0)} of {running.get('total', len(BUCKETS))} shapes; `multispec cache` shows it)"
        )
        return
    last = last_status(hf, role)
    if last is not None and last.get("state") == "failed":  # not started again on every run
        note(
            f"multispec: {hf.name} runs eagerly: its compiled steps could not be made here ({last.get('error', '?')}); "
            "`multispec cache` shows the log, `multispec compile` tries again"
        )
        return
    _waiting.append((weakref.ref(hf), role))
    pid = spawn(hf, role)
    note(
        f"multispec: {hf.name} runs eagerly in this process; its compiled steps are being made in the background "
        f"(process {pid}, once on this machine; `multispec cache` shows it), and later runs use them"
    )


_waiting: list[tuple[weakref.ref, str]] = []  # (model, role) this process runs eagerly while a worker makes its steps
_checked = 0.0
CHECK_SECONDS = 5.0  # how often a long-lived process (a server) looks for them


def waiting(hf: HFModel) -> bool:
    """Whether this process runs `hf` eagerly while its compiled steps are made (`settle` started or found a
    worker for it)."""
    return any(ref() is hf for ref, _ in _waiting)


def switch_ready() -> None:
    """A model this process runs eagerly while a worker makes its steps runs compiled from its next generation on,
    once they are all made (a server started on a fresh machine gets the compiled speed without a restart). A
    generation keeps the engine its cache was made for (`HFModel.new_cache`), so none mixes the two."""
    global _checked
    if not _waiting or time.monotonic() - _checked < CHECK_SECONDS:
        return
    _checked = time.monotonic()
    for entry in list(_waiting):
        ref, role = entry
        hf = ref()
        if hf is None or hf.compile or (last_status(hf, role) or {}).get("state") == "failed":
            _waiting.remove(entry)  # (a failed worker's steps are not looked for again)
        elif worker_for(hf, role) is None and not missing(hf, role):
            _waiting.remove(entry)
            hf.enable_compile()
            note(f"multispec: {hf.name} runs compiled from now on (its steps were made in the background)")


# --- workers -------------------------------------------------------------------------------------------------


def folder() -> Path:
    return cache_dir() / "compiling"


def _worker_id(source: str, role: str, dtype, device) -> str:
    text = f"{source}|{role}|{dtype}|{device}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def worker_source(hf) -> str:
    """What names a model's worker and its status: where the model was loaded from, and, for a draft cut to its
    most frequent tokens (`HFModel.with_head_rows`), how many it keeps."""
    return source_key(getattr(hf, "source", None) or hf.name, getattr(hf, "draft_vocab", None))


def source_key(source: str, draft_vocab: int | None = None) -> str:
    """`worker_source` from its parts (what `multispec compile` was given)."""
    return f"{source}|draft_vocab={draft_vocab}" if draft_vocab else source


def status_path(source: str, role: str, dtype, device) -> Path:
    return folder() / f"{_worker_id(source, role, dtype, device)}.json"


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return process_state(pid) not in ("Z", "X")  # an ended child not yet reaped by its parent


def process_state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, T: stopped, Z: ended), or None where there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def workers() -> list[dict]:
    """Every worker's last status (model, role, state: queued, compiling, done or failed; done and total shapes;
    pid; alive), newest first."""
    found = []
    for path in folder().glob("*.json"):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict):
            entry["alive"] = _alive(entry.get("pid"))
            entry["path"] = str(path)
            found.append(entry)
    return sorted(found, key=lambda e: -float(e.get("updated", 0)))


def last_status(hf: HFModel, role: str) -> dict | None:
    """The last status a worker for this model and role wrote on this machine, if any."""
    path = status_path(worker_source(hf), role, hf.dtype, hf.device)
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) else None


def worker_for(hf: HFModel, role: str) -> dict | None:
    """The status of a live worker for this model and role, if one is queued or compiling."""
    entry = last_status(hf, role)
    live = entry is not None and entry.get("state") in ("queued", "compiling") and _alive(entry.get("pid"))
    return entry if live else None


def worker_command(hf: HFModel, role: str) -> list[str]:
    """The command of a background worker that compiles `hf`'s steps for `role` (`multispec compile`)."""
    command = [sys.executable, "-m", "multispec", "compile", f"--{role}", hf.source, "--only", role]
    if getattr(hf, "draft_vocab", None):  # the draft's head cut again to its most frequent tokens
        command += ["--draft-vocab", str(hf.draft_vocab)]
    return [*command, "--dtype", str(hf.dtype).removeprefix("torch."), "--device", str(hf.device), "--background"]


def spawn(hf: HFModel, role: str) -> int:
    """Start a background worker that compiles `hf`'s steps for `role`; returns its process id. Its output goes to
    a log beside its status."""
    folder().mkdir(parents=True, exist_ok=True)
    source = worker_source(hf)
    path = status_path(source, role, hf.dtype, hf.device)
    log = path.with_suffix(".log")
    with open(log, "w") as out:
        process = subprocess.Popen(
            worker_command(hf, role),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    write_status(path, model=hf.name, source=source, role=role, pid=process.pid, state="queued", done=0)
    look_again()  # the next generation looks, and stops it
    return process.pid


def write_status(path: Path, **fields) -> None:
    try:
        entry = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        entry = {}
    entry.update(fields, total=len(BUCKETS), updated=time.time())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry))
    os.replace(tmp, path)


_holding = False  # this process holds the compile lock


@contextlib.contextmanager
def compile_lock(wait_note: str | None = None):
    """Held while a process compiles steps for this machine (workers and `multispec compile`), so that two never
    compile at once. Blocks while another holds it (after printing `wait_note`, if given)."""
    import fcntl

    global _holding
    if _holding:  # (a flock held through another handle of this process would block it)
        yield
        return
    folder().mkdir(parents=True, exist_ok=True)
    with open(folder() / "lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait_note:
                note(wait_note)
            fcntl.flock(handle, fcntl.LOCK_EX)
        _holding = True
        try:
            yield
        finally:
            _holding = False
            fcntl.flock(handle, fcntl.LOCK_UN)


def _live() -> list[int]:
    if not folder().is_dir():
        return []
    return [
        w["pid"]
        for w in workers()
        if w["alive"] and w.get("state") in ("queued", "compiling") and w["pid"] != os.getpid()
    ]


def _signal(pids: list[int], sig) -> list[int]:
    done = []
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, sig)  # the worker and the compiler processes it started
            done.append(pid)
    return done


_pause_lock = threading.Lock()
_pausing = 0  # generations running in this process
_paused: list[int] = []
# when the folder was last found without a live worker: a generation starting within LOOK_AGAIN seconds of that
# does not look again (a look costs a folder listing; a new worker spends longer than that importing torch
# before it compiles, and the next look stops it)
LOOK_AGAIN = 0.5
_none_live_at = float("-inf")


def look_again() -> None:
    """The next generation looks for workers whenever the last look was (a worker was just started)."""
    global _none_live_at
    _none_live_at = float("-inf")


def _live_to_pause() -> list[int]:
    global _none_live_at
    now = time.monotonic()
    if now - _none_live_at < LOOK_AGAIN:
        return []
    live = _live()
    if not live:
        _none_live_at = now
    return live


@contextlib.contextmanager
def paused():
    """While a generation runs (`multispec.generate`, a batch), this machine's background workers are stopped and
    then continued: on a small machine a compile beside decoding slows both many times over (their threads
    contend for the same cores), so a worker compiles while no generation runs."""
    global _pausing
    with _pause_lock:
        _pausing += 1
        if _pausing == 1:
            _paused.extend(_signal(_live_to_pause(), signal.SIGSTOP))
    try:
        yield
    finally:
        with _pause_lock:
            _pausing -= 1
            if _pausing == 0:
                _signal(_paused, signal.SIGCONT)
                _paused.clear()


def wait_for_workers() -> None:
    """Wait until no background worker compiles (a process about to compile or measure in the foreground: two
    compiles at once, or a measurement beside one, each run far slower on a small machine)."""
    live = _live()
    if not live or _holding:
        return
    _signal(live, signal.SIGCONT)  # one that a process stopped and never continued (it was killed) goes on
    with compile_lock("multispec: waiting for the background compile to finish (`multispec cache` shows it) ..."):
        pass


def stop_workers() -> list[int]:
    """End every live worker (`multispec cache --clear`); returns their process ids."""
    live = _live()
    _signal(live, signal.SIGCONT)
    return _signal(live, signal.SIGTERM)
