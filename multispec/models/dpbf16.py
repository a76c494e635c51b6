"""Linear maps through our own bfloat16 kernel (`dpbf16.cpp`), for CPUs with AVX512-BF16 and no AMX.

There, inductor's C++ GEMM template turns bfloat16 into float32 and multiplies in float32, and oneDNN is slow
for the few rows of a decoding step; the CPU's `vdpbf16ps` multiplies bfloat16 pairs into float32 at twice the
rate. The kernel is a third kernel variant of a compiled step (`hf.DPBF16`): raced against the others on the
machine that runs it, per shape, and kept only where its whole step ran faster.

It is built from source on a machine's first use (about 20 s, with torch's extension builder and ninja) into
the cache folder, and loaded from there afterwards. Inside `routed(model)`, the model's linear maps run through
it, on weights packed for it and registered as buffers, so that an export takes them as the graph's constants.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import statistics
import time
import types
from pathlib import Path

import torch

from .. import machine

SOURCE = Path(__file__).with_name("dpbf16.cpp")
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp"]
COLUMNS = 16  # output columns per packed block (`dpbf16.cpp`)
BUFFER = "dpbf16_packed"
BIAS = "dpbf16_bias"  # a concatenated product's biases (`routed`)
GROUP = "_dpbf16_group"
VARIABLE = "MULTISPEC_DPBF16"
_state: dict[str, str | None] = {}  # "why": None once loaded, else why not (absent: not tried yet)


def unavailable() -> str | None:
    """None where the kernel runs in this process (built or loaded now, once), else why it does not."""
    if "why" not in _state:
        _state["why"] = _load()
    return _state["why"]


def built() -> bool:
    """Whether the kernel runs in this process, or is built on this machine already (so that loading it compiles
    nothing); False where it was never built here, or does not run."""
    if "why" in _state:
        return _state["why"] is None
    return any((machine.store_path().with_name("kernels") / f"dpbf16-{_digest()}").glob("*.so"))


def _load() -> str | None:
    if os.environ.get(VARIABLE, "1") == "0":
        return f"{VARIABLE}=0"

    if "avx512_bf16" not in machine.cpu_flags():
        return "no AVX512-BF16 on this CPU"
    if not SOURCE.exists():
        return f"its source is not installed ({SOURCE})"
    from torch.utils import cpp_extension

    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        return "ninja is not installed (pip install ninja)"

    digest = _digest()
    build = machine.store_path().with_name("kernels") / f"dpbf16-{digest}"
    build.mkdir(parents=True, exist_ok=True)
    try:
        cpp_extension.load(
            name=f"multispec_dpbf16_{digest}",
            sources=[str(SOURCE)],
            extra_cflags=FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            is_python_module=False,
            verbose=False,
        )
    except Exception as e:  # noqa: BLE001 - a machine without a working compiler runs the other variants
        return f"its build failed ({type(e).__name__}: {' '.join(str(e).split())[:160]})"
    torch.library.register_fake("multispec_dpbf16::linear")(_shape)
    torch.library.register_fake("multispec_dpbf16::linear_tiles")(_shape)
    torch.library.register_fake("multispec_dpbf16::attend")(_attended)
    torch.library.register_fake("multispec_dpbf16::attend_tokens")(_attended_tokens)
    set_prefetch(_calibrated_prefetch(digest))
    return None


# The kernel's software prefetch of weights (`dpbf16.cpp`, `Prefetch`): none, the line 32 pairs further along
# the same block, or the line at the same place in the thread's next group of blocks. It changes no result, only
# how well memory and arithmetic overlap, which depends on the CPU: each machine measures its own (`calibrate`).
PREFETCHES = ("none", "near", "ahead")
CALIBRATION_ROWS = (1, 2, 3, 4, 8, 16, 32, 64)
PREFETCH_MARGIN = 0.03  # a prefetch is kept only where it ran at least this much faster than none


def set_prefetch(modes: dict[int, str]) -> None:
    """The prefetch of `linear` by number of rows: {rows: mode}; a row count takes the mode of the largest
    given count at or below it (and 1 row's below 1)."""
    if not modes:
        raise ValueError("dpbf16.set_prefetch: no modes")
    unknown = sorted(set(modes.values()) - set(PREFETCHES))
    if unknown:
        raise ValueError(f"dpbf16.set_prefetch: unknown modes {unknown}; modes are {', '.join(PREFETCHES)}")
    counts = sorted(modes)
    table = [PREFETCHES.index(modes[max([c for c in counts if c <= rows] or counts[:1])]) for rows in range(65)]
    torch.ops.multispec_dpbf16.set_prefetch(table)


def calibrate(rows: tuple[int, ...] = CALIBRATION_ROWS, megabytes: int = 128, repeats: int = 5) -> dict:
    """Times `linear` in each prefetch mode over `megabytes` of weights (several times the caches, as a model's
    step streams them) at each row count, interleaved: {"ms": {rows: {mode: median}}, "modes": {rows: mode}}."""
    shapes = ((3072, 576), (576, 1536))  # a decoder layer's widest maps: wide and deep blocks, both alignments
    per_pair = sum(n * k * 2 for n, k in shapes)
    weights = [
        (torch.full((n // COLUMNS, k // 2, COLUMNS, 2), 0.01, dtype=torch.bfloat16), n, k)
        for _ in range(max(1, megabytes * 2**20 // per_pair))
        for n, k in shapes
    ]
    ms: dict[int, dict[str, float]] = {}
    try:
        for count in rows:
            inputs = {k: torch.full((count, k), 0.5, dtype=torch.bfloat16) for _, k in shapes}
            times: dict[str, list[float]] = {mode: [] for mode in PREFETCHES}
            for repeat in range(repeats + 1):
                first = repeat % len(PREFETCHES)  # each mode leads in turn
                for mode in PREFETCHES[first:] + PREFETCHES[:first]:
                    set_prefetch({1: mode})
                    t0 = time.perf_counter()
                    for packed, n, k in weights:
                        linear(inputs[k], packed, None, n)
                    if repeat:  # the first pass of each mode warms up
                        times[mode].append(time.perf_counter() - t0)
            ms[count] = {mode: round(1e3 * statistics.median(t), 3) for mode, t in times.items()}
    finally:
        set_prefetch({1: "none"})
    modes = {}
    for count, by_mode in ms.items():
        best = min(by_mode, key=by_mode.get)
        modes[count] = best if by_mode[best] < (1 - PREFETCH_MARGIN) * by_mode["none"] else "none"
    return {"ms": ms, "modes": modes}


def _calibrated_prefetch(digest: str) -> dict[int, str]:
    """This machine's prefetch modes for the kernel built as `digest`: measured once, kept in the kernel store."""
    store = machine.kernel_store_path()
    key = (
        f"dpbf16 prefetch|{digest}|{machine.describe_device('cpu')}|threads={torch.get_num_threads()}|"
        f"isa={machine.instruction_sets()}"
    )
    entry = machine.read_store(store).get(key)
    if isinstance(entry, dict) and isinstance(entry.get("modes"), dict):
        modes = {int(rows): mode for rows, mode in entry["modes"].items()}
        if modes and set(modes.values()) <= set(PREFETCHES):
            return modes
    t0 = time.perf_counter()
    entry, settled = machine.undisturbed(calibrate)
    machine.calibration_seconds += time.perf_counter() - t0
    if settled:
        machine.write_store_entry(store, key, entry)
    return entry["modes"]


@functools.cache
def _digest() -> str:
    """The build's name: the source, its flags and torch's version."""
    return hashlib.blake2b(
        SOURCE.read_bytes() + " ".join(FLAGS).encode() + torch.__version__.encode(), digest_size=6
    ).hexdigest()


def _attended(query, keys, values, mask, dv, scaling):
    return query.new_empty((*query.shape[:-1], dv))


def attend(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, dv: int, scaling: float
) -> torch.Tensor:
    """Softmax attention in float32 with every sum in one order (`dpbf16.cpp`, `attend_row`): query [B, Hq, n,
    d], keys [B, Hkv, >= K, d] and values [B, Hkv, >= K, >= dv] of one type, float32 or bfloat16 (widened exactly as
    they are read; the first K slots are read, K = mask.shape[-1]), additive float32 mask [B, 1, n, K] -> [B, Hq,
    n, dv] in the query's type. A row's output
    depends only on the keys it sees with a weight above 0, in their slot order: not on the other rows, nor on
    masked slots between them, so a tree node gets a chain step's bits."""
    return torch.ops.multispec_dpbf16.attend(query, keys, values, mask, dv, scaling)


def _attended_tokens(query, keys, values, rows, mask, dv, scaling):
    return query.new_empty((*query.shape[:-1], dv))


def attend_tokens(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    mask: torch.Tensor,
    dv: int,
    scaling: float,
) -> torch.Tensor:
    """`attend` for the packed tokens of a batched step, each over its own row of a batch cache.

    Args:
        query: [T, Hq, d], one entry per packed token.
        keys: [R, Hkv, >= K, d] and values [R, Hkv, >= K, >= dv], float32 or bfloat16: the batch cache's buffers.
        rows: [T] int64, the cache row each token reads.
        mask: [T, K] additive float32, each token's view of its row (-inf past what it sees).
        dv: value size; scaling: the scores' factor.

    Returns:
        [T, Hq, dv] in the query's type: each token's bits are those `attend` gives it alone (its sums in
        `attend_row`'s order), whatever else is packed with it and however wide K is."""
    return torch.ops.multispec_dpbf16.attend_tokens(query, keys, values, rows, mask, dv, scaling)


def attends_tokens(head_dim: int, value_dim: int) -> bool:
    """Whether `attend_tokens` takes heads of these sizes (its blocked form only)."""
    return head_dim == value_dim and head_dim in (64, 128)


def attends(head_dim: int, value_dim: int) -> bool:
    """Whether `attend` takes heads of these sizes."""
    return head_dim % 16 == 0 and value_dim % 16 == 0 and value_dim <= 256


def _shape(input, packed, bias, out_features):
    return input.new_empty((*input.shape[:-1], out_features))


def eligible(module: torch.nn.Module) -> bool:
    """A plain linear map with bfloat16 weights on the CPU and an even number of inputs (pairs)."""
    return (
        type(module) is torch.nn.Linear
        and module.weight.dtype == torch.bfloat16
        and module.weight.device.type == "cpu"
        and module.in_features % 2 == 0
    )


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> [ceil(N / 16), K / 2, 16, 2]: per block of 16 outputs, the pairs along K (zero
    outputs pad the last block)."""
    n, k = weight.shape
    if k % 2:
        raise ValueError(f"dpbf16.pack: {k} inputs, an odd number")
    weight = torch.nn.functional.pad(weight, (0, 0, 0, -n % COLUMNS))
    return weight.reshape(-1, COLUMNS, k // 2, 2).transpose(1, 2).contiguous()


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [..., K] bfloat16 -> [..., out_features] bfloat16: x times the weight `packed` was packed from (`pack`)."""
    return torch.ops.multispec_dpbf16.linear(x, packed, None if bias is None else bias.float(), out_features)


def linear_tiles(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """`linear` on AMX tiles (`tiles_run`): the same packed weight and result shape; each row's output sums its
    products in one order whatever the rows (not `linear`'s order), and up to 16 rows cost one pass over the
    weight. Inputs in multiples of 32."""
    return torch.ops.multispec_dpbf16.linear_tiles(x, packed, None if bias is None else bias.float(), out_features)


TILES_VARIABLE = "MULTISPEC_TILES"  # "0": our products stay off the AMX tiles (the dot-product kernel instead)


def tiles_run() -> bool:
    """Whether `linear_tiles` runs here: the kernel loaded, a CPU with AMX-BF16, the tiles granted to this
    process, and not turned off (`MULTISPEC_TILES=0`)."""
    if os.environ.get(TILES_VARIABLE, "1") == "0":
        return False
    if unavailable() is not None or not {"amx_bf16", "amx_tile"} <= machine.cpu_flags():
        return False
    return bool(torch.ops.multispec_dpbf16.tiles())


def _forward(self, x):
    return linear(x, getattr(self, BUFFER), self.bias, self.out_features)


def _member_forward(self, x):
    # one of several maps that read the same input, made one product (`routed(..., concat=True)`): the first
    # call on an input computes all of their outputs, and each map takes its columns
    group, offset = self.__dict__[GROUP]
    if group["last"] is None or group["last"][0] is not x:
        owner = group["owner"]
        group["last"] = (x, linear(x, getattr(owner, BUFFER), owner._buffers.get(BIAS), group["outputs"]))
    return group["last"][1][..., offset : offset + self.out_features]


def routes(model: torch.nn.Module) -> bool:
    return any(eligible(m) for m in model.modules())


def routes_all(model: torch.nn.Module) -> bool:
    """Whether the kernel takes every matrix product of the model's layers (no other linear map, nor
    transformers' Conv1D, is left to a library kernel)."""
    from transformers.pytorch_utils import Conv1D

    maps = [m for m in model.modules() if isinstance(m, torch.nn.Linear | Conv1D)]
    return bool(maps) and all(eligible(m) for m in maps)


@torch.no_grad()
def shared_inputs(model: torch.nn.Module) -> list[list[torch.nn.Linear]]:
    """Runs of eligible linear maps that a forward calls one after another on the same input tensor (a
    layer's query, key and value maps; its gate and up maps), seen in one eager forward of one token."""
    calls: list[tuple[torch.nn.Module, torch.Tensor]] = []  # the inputs are held, so no id is reused meanwhile
    hooks = [
        m.register_forward_pre_hook(lambda m, args: calls.append((m, args[0]))) for m in model.modules() if eligible(m)
    ]
    try:
        device = next(model.parameters()).device
        model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    runs: list[list[torch.nn.Linear]] = []
    for i, (m, x) in enumerate(calls):
        if i and calls[i - 1][1] is x and m.in_features == calls[i - 1][0].in_features:
            runs[-1].append(m)
        else:
            runs.append([m])
    seen: set[int] = set()
    groups = []
    for run in runs:
        if len(run) > 1 and not seen & {id(m) for m in run} and len({id(m) for m in run}) == len(run):
            groups.append(run)
            seen |= {id(m) for m in run}
    return groups


@contextlib.contextmanager
def routed(model: torch.nn.Module, concat: bool = False):
    """Inside, the model's eligible linear maps run through the kernel (which must be loaded: `unavailable`)
    on packed copies of their weights, held as non-persistent buffers; afterwards they are as before. With
    `concat`, maps that read the same input (`shared_inputs`) are one product on their weights stacked."""
    changed = []
    try:
        with torch.no_grad():
            for members in shared_inputs(model) if concat else []:
                owner = members[0]
                owner.register_buffer(BUFFER, pack(torch.cat([m.weight.detach() for m in members])), persistent=False)
                if any(m.bias is not None for m in members):
                    owner.register_buffer(
                        BIAS,
                        torch.cat(
                            [m.weight.new_zeros(m.out_features) if m.bias is None else m.bias.detach() for m in members]
                        ),
                        persistent=False,
                    )
                group = {"owner": owner, "outputs": sum(m.out_features for m in members), "last": None}
                offset = 0
                for m in members:
                    changed.append((m, m.__dict__.get("forward")))
                    m.__dict__[GROUP] = (group, offset)
                    m.forward = types.MethodType(_member_forward, m)
                    offset += m.out_features
            for m in model.modules():
                if eligible(m) and GROUP not in m.__dict__:
                    changed.append((m, m.__dict__.get("forward")))  # an instance's own forward (`linears.pack`)
                    m.register_buffer(BUFFER, pack(m.weight.detach()), persistent=False)
                    m.forward = types.MethodType(_forward, m)
        yield len(changed)
    finally:
        for m, own in changed:
            for name in (BUFFER, BIAS):
                m._buffers.pop(name, None)
                m._non_persistent_buffers_set.discard(name)
            m.__dict__.pop(GROUP, None)
            if own is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = own
