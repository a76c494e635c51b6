"""Linear maps on weights packed once for oneDNN (the CPU's matrix library), where this machine runs them faster.

`torch.nn.functional.linear` hands oneDNN a plain weight, which it lays out again for its kernel at every call;
a weight packed once at load skips that work. Whether packed runs faster depends on the machine (a kernel choice
made on one host has inverted on another), so `pack` times both, here, on the model's own maps, and packs only
where packed ran faster. Only the engine's eager steps use the packed weights (inside `active()`): transformers'
own calls on the same model (the bench's `hf` peers) and compiled steps use the plain ones. The packed copies
are kept beside the plain weights: the linear maps' memory doubles.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import statistics
import threading
import time
import types
import weakref

import torch

from ..machine import instruction_sets, kernel_store_path, read_store, write_store_entry


def hash_shapes(shapes) -> str:
    """A short name for a model's linear shapes."""
    return hashlib.sha1(repr(shapes).encode()).hexdigest()[:12]


GAIN = 0.95  # packed is kept where a pass over the model's linear maps takes at most this share of the plain time
ROUNDS = 3
_state = threading.local()
_CHOICES: dict[tuple, tuple[bool, float, float]] = {}
# module -> (the plain weight's data pointer and dtype when packed, the packed weight): kept off the module, so
# that a copy of the model (deepcopy) or its weights moved or cast (`.to`) fall back to the plain weights
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def active():
    """Inside: packed linear maps run on their packed weights."""
    before = getattr(_state, "on", False)
    _state.on = True
    try:
        yield
    finally:
        _state.on = before


def is_active() -> bool:
    return getattr(_state, "on", False)


def _packed_forward(self, x):
    packed = packed_weight(self) if getattr(_state, "on", False) else None
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
    return torch.nn.functional.linear(x, self.weight, self.bias)


def packed_weight(module) -> torch.Tensor | None:
    """The packed weight an eager step reads for `module`, if it is packed and its plain weight unchanged."""
    entry = _PACKED.get(module)
    return entry[1] if entry is not None and entry[0] == (module.weight.data_ptr(), module.weight.dtype) else None


def _linears(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear]  # exactly Linear: not quantised subclasses


def packable(model) -> str | None:
    """None when the model's linear maps can be packed here, else why not."""
    if os.environ.get("MULTISPEC_PACKED_LINEARS", "1") == "0":
        return "MULTISPEC_PACKED_LINEARS=0"
    if not torch.backends.mkldnn.is_available():
        return "no oneDNN in this torch"
    found = _linears(model)
    if not found:
        return "no linear maps"
    if any(m.weight.device.type != "cpu" for m in found):
        return "not on the CPU"
    dtypes = {m.weight.dtype for m in found}
    if dtypes == {torch.bfloat16}:
        return None if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "no oneDNN bfloat16 on this CPU"
    return None if dtypes == {torch.float32} else f"weights in {', '.join(sorted(map(str, dtypes)))}"


@torch.inference_mode()
def pack(model) -> tuple[bool, float, float]:
    """Pack the model's linear maps if a pass over all of them, one row each (a decoding step's products), ran
    faster packed on this machine. Returns (packed?, plain seconds, packed seconds) of that pass (medians of
    ROUNDS interleaved rounds); the choice is remembered per shapes, dtype and thread count, in this machine's
    kernel store (`machine.kernel_store_path`)."""
    found = _linears(model)
    weights = [m.weight.detach() for m in found]
    key = (tuple((w.shape[1], w.shape[0]) for w in weights), weights[0].dtype, torch.get_num_threads())
    packed = None
    # the choice is kept for the machine: a close race decided again in every process would flip between runs,
    # and with it the bits of a step (and the rows a batched step is padded to: `hf.kernels.invariant_rows`)
    stored = (
        f"packed-linears|{hash_shapes(key[0])}|{key[1]}|threads={key[2]}|torch={torch.__version__}|"
        f"isa={instruction_sets()}"
    )
    if key not in _CHOICES:
        saved = read_store(kernel_store_path()).get(stored)
        if isinstance(saved, list) and len(saved) == 3:
            _CHOICES[key] = (bool(saved[0]), float(saved[1]), float(saved[2]))
    if key not in _CHOICES:
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
        inputs = {}
        for w in weights:
            inputs.setdefault(
                w.shape[1], torch.randn(1, 1, w.shape[1], generator=torch.Generator().manual_seed(0)).to(w.dtype)
            )
        bias = [m.bias for m in found]

        def plain_pass():
            for w, b in zip(weights, bias, strict=True):
                torch.nn.functional.linear(inputs[w.shape[1]], w, b)

        def packed_pass():
            for p, w, b in zip(packed, weights, bias, strict=True):
                torch.ops.mkldnn._linear_pointwise(inputs[w.shape[1]], p, b, "none", [], "")

        times = {plain_pass: [], packed_pass: []}
        for f in times:  # one warm-up each
            f()
        for _ in range(ROUNDS):
            for f, t in times.items():
                t0 = time.perf_counter()
                f()
                t.append(time.perf_counter() - t0)
        plain, fast = statistics.median(times[plain_pass]), statistics.median(times[packed_pass])
        _CHOICES[key] = (fast <= GAIN * plain, plain, fast)
        write_store_entry(kernel_store_path(), stored, list(_CHOICES[key]))
    chosen = _CHOICES[key]
    if chosen[0]:  # (where the choice was remembered from another model of these shapes, packed only now)
        packed = packed or [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
        for m, p in zip(found, packed, strict=True):
            _PACKED[m] = ((m.weight.data_ptr(), m.weight.dtype), p)
            m.forward = types.MethodType(_packed_forward, m)
    return chosen
