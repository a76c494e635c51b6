"""Linear maps on weights packed once, for oneDNN (the CPU's matrix library) or our AMX kernel, where this machine
runs them faster.

`torch.nn.functional.linear` hands oneDNN a plain weight, which it lays out again for its kernel at every call;
a weight packed once at load skips that work. Whether packed runs faster depends on the machine (a kernel choice
made on one host has inverted on another), so `pack` times both, here, on the model's own maps, and packs only
where packed ran faster. On a CPU with AMX, a bfloat16 model's maps then race our tile kernel
(`dpbf16.linear_tiles`) against that choice: oneDNN's few-row products there read the weights at well under the
memory's speed, and the tile kernel computes up to 16 rows in one pass over them, each row's sums in one order
whatever the rows (so a batched step needs no padding for batch invariance). On a CPU with AVX512-BF16 but no
AMX, our dot-product kernel (`dpbf16.linear`, on the same packed layout, also one order per row) races in its
place. Only the engine's eager steps use
the packed weights (inside `active()`): transformers' own calls on the same model (the bench's `hf` peers) and
compiled steps use the plain ones. The packed copies are kept beside the plain weights: the linear maps' memory
doubles.
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

from ..machine import instruction_sets, kernel_store_path, read_store, undisturbed, write_store_entry
from . import dpbf16


def hash_shapes(shapes) -> str:
    """A short name for a model's linear shapes."""
    return hashlib.sha1(repr(shapes).encode()).hexdigest()[:12]


GAIN = 0.95  # packed is kept where a pass over the model's linear maps takes at most this share of the plain time
ROUNDS = 3
_state = threading.local()
_CHOICES: dict[tuple, tuple[bool, float, float]] = {}
# our kernel's race, per kind and shapes: (kept?, the other choice's seconds, our kernel's seconds)
_TILES: dict[tuple, tuple[bool, float, float]] = {}
# oneDNN on a weight packed once; our AMX tile kernel (`dpbf16.linear_tiles`); our AVX512-BF16 dot-product kernel
# (`dpbf16.linear`), where the tiles do not run
ONEDNN, TILES, DPBF16 = "onednn", "tiles", "dpbf16"
_OURS = {TILES: dpbf16.linear_tiles, DPBF16: dpbf16.linear}
# module -> (the plain weight's data pointer and dtype when packed, the packed weight, its kernel's name): kept off
# the module, so that a copy of the model (deepcopy) or its weights moved or cast (`.to`) fall back to the plain
# weights
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
        kind = _PACKED[self][2]
        if kind != ONEDNN:
            return _OURS[kind](x, packed, self.bias, self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
    return torch.nn.functional.linear(x, self.weight, self.bias)


def packed_weight(module) -> torch.Tensor | None:
    """The packed weight an eager step reads for `module`, if it is packed and its plain weight unchanged."""
    entry = _PACKED.get(module)
    return entry[1] if entry is not None and entry[0] == (module.weight.data_ptr(), module.weight.dtype) else None


def packed_kind(module) -> str | None:
    """ONEDNN, TILES or DPBF16: the kernel an eager step runs `module` on, or None for the plain weight."""
    return _PACKED[module][2] if type(module) is torch.nn.Linear and packed_weight(module) is not None else None


def ours() -> str | None:
    """Which of our kernels races for a model's maps here: TILES on a CPU with AMX (and the tiles granted), DPBF16
    on one with AVX512-BF16 only (`MULTISPEC_TILES=0` takes it on an AMX CPU too), None where neither runs."""
    if dpbf16.unavailable() is not None:
        return None
    return TILES if dpbf16.tiles_run() else DPBF16


def our_kind(module) -> str | None:
    """The kernel of ours that takes this map here, or None: the tiles (`ours`) where its inputs come in multiples
    of 32, else the dot-product kernel (pairs of inputs), for a bfloat16 map on the CPU."""
    kind = ours()
    if kind is None or not dpbf16.eligible(module):
        return None
    return TILES if kind == TILES and module.in_features % 32 == 0 else DPBF16


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

        (plain, fast), settled = undisturbed(lambda: _race(plain_pass, packed_pass))
        _CHOICES[key] = (fast <= GAIN * plain, plain, fast)
        if settled:
            write_store_entry(kernel_store_path(), stored, list(_CHOICES[key]))
    chosen = _CHOICES[key]
    if chosen[0]:  # (where the choice was remembered from another model of these shapes, packed only now)
        packed = packed or [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
        for m, p in zip(found, packed, strict=True):
            _PACKED[m] = ((m.weight.data_ptr(), m.weight.dtype), p, ONEDNN)
            m.forward = types.MethodType(_packed_forward, m)
    tiled = _tiles(found, key, stored)
    return (True, *chosen[1:]) if tiled else chosen


def _tiles(found: list[torch.nn.Linear], key: tuple, stored: str) -> bool:
    """Race our kernels (`our_kind`: the tile kernel, and the dot-product one for maps the tiles do not take or
    without AMX) on the maps they take against what `pack` left them on (one row each, ROUNDS interleaved passes
    over every map); where they were faster, those maps run on them. Remembered like `pack`'s choice, per build of
    the kernel."""
    kind = ours()
    chosen = [(m, our_kind(m)) for m in found]
    takes = [m for m, k in chosen if k is not None]
    if not takes:
        return False
    kinds = [k for _, k in chosen if k is not None]
    prefix = "tile-linears" if kind == TILES else "dpbf16-linears"
    stored = stored.replace("packed-linears", prefix, 1) + f"|dpbf16={dpbf16._digest()}"
    if kind == TILES and DPBF16 in kinds:  # (some maps on the dot products beside the tiles)
        stored += "|mixed"
    key = (kind, *key)
    if key not in _TILES:
        saved = read_store(kernel_store_path()).get(stored)
        if isinstance(saved, list) and len(saved) == 3:
            _TILES[key] = (bool(saved[0]), float(saved[1]), float(saved[2]))
    tiles = None
    if key not in _TILES:
        tiles = [dpbf16.pack(m.weight.detach()) for m in takes]
        inputs = {
            n: torch.randn(1, 1, n, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
            for n in {m.in_features for m in found}
        }

        def before_pass():
            with active():
                for m in found:
                    m(inputs[m.in_features])

        def ours_pass():
            with active():
                for m in found:
                    if m not in taken:
                        m(inputs[m.in_features])
            for m, t, k in zip(takes, tiles, kinds, strict=True):
                _OURS[k](inputs[m.in_features], t, m.bias, m.out_features)

        taken = set(takes)
        (before, fast), settled = undisturbed(lambda: _race(before_pass, ours_pass))
        _TILES[key] = (fast <= GAIN * before, before, fast)
        if settled:
            write_store_entry(kernel_store_path(), stored, list(_TILES[key]))
    if not _TILES[key][0]:
        return False
    tiles = tiles or [dpbf16.pack(m.weight.detach()) for m in takes]
    for m, t, k in zip(takes, tiles, kinds, strict=True):
        _PACKED[m] = ((m.weight.data_ptr(), m.weight.dtype), t, k)
        m.forward = types.MethodType(_packed_forward, m)
    return True


def _race(first, second) -> tuple[float, float]:
    """The median seconds of `first()` and of `second()` over ROUNDS interleaved rounds, after one warm-up each."""
    times: dict = {first: [], second: []}
    for f in times:
        f()
    for _ in range(ROUNDS):
        for f, t in times.items():
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return statistics.median(times[first]), statistics.median(times[second])
