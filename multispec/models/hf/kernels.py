"""The compiled step's kernel variants on a CPU, the dtype a device gets by default, and how many rows make an eager
step batch-invariant here. Constants and pure functions: the compiled steps that use them are `compiled.py`'s."""

from __future__ import annotations

import contextlib
import inspect
import warnings

import torch

from ...machine import cpu_flags
from .. import linears

_COMPILE_ISOLATES = "isolate_recompiles" in inspect.signature(torch.compile).parameters
COMPILED_TOKENS = 64  # the largest bucket of new tokens a compiled forward takes; longer feeds run eagerly
GRAPHS_KEPT = 64  # captured CUDA graphs a model keeps (least recently used dropped first)
GRAPH_WARMUP = 2  # eager runs of a step before it is captured (lazy initialisation stays out of the graph)

# How a CPU step's matrix products are compiled (inductor options, frozen weights in both). Each shape's graph
# is timed whole, in place, in every variant, because inductor's own autotuning times each product alone, with
# its weights hot in cache, which misjudges a one-row step whose weights stream from memory.
KERNELS = {
    # oneDNN's linear on weights packed at compile time, for every product
    "onednn": {"freezing": True},
    # each product autotuned alone between oneDNN and inductor's C++ GEMM template (max-autotune)
    "autotuned": {"freezing": True, "max_autotune": True, "max_autotune_report_choices_stats": False},
    # bfloat16 products through our own AVX512-BF16 kernel (`models/dpbf16.py`), where it builds and runs here
    "dpbf16": {"freezing": True},
}
DPBF16 = "dpbf16"
# A variant's name with this suffix: the same, with the products that read the same input (a layer's query, key
# and value maps; its gate and up maps) concatenated into one (inductor's `concat_linear`, off by default because
# it does not gain on every CPU). Tried on the fastest of `KERNELS` for each shape: one compile more, not one per
# variant.
CONCAT = "+concat"
VARIANTS = (*KERNELS, *(kind + CONCAT for kind in KERNELS))
CHOICE_ROUNDS = 5  # interleaved timed steps per variant when choosing
# `compile="invariant"` (and compile=True where it costs no more, `HFModel.resolve_kernel`): one variant for every
# shape, in which a token's logits do not depend on the bucket it is scored in. On oneDNN: every product on frozen
# weights, rows padded to `min_rows`, attention through the batch-invariant operator (`static.attend`, with each
# query's split). The variants above differ from bucket to bucket (autotuning picks
# other kernels per shape, and traced attention sums over a key length that grows with the bucket), so greedy
# speculative outputs drift from greedy `ar` in a reduced precision.
INVARIANT = "invariant"
INVARIANT_KERNELS = {"freezing": True}
# On our kernels, where they run here: each product's output sums in one order whatever the rows fed with it, so
# rows are not padded (products that read one input are concatenated, which changes no output's sum), and
# attention runs through our fixed-order operator (`dpbf16.attend`), invariant to a tree's layout without splits.
INVARIANT_DPBF16 = f"{INVARIANT}+{DPBF16}{CONCAT}"
# A fast step's race for a shape times that variant too: its attention (`dpbf16.attend`, rows in blocks) can beat
# inductor's traced one, and a draft, whose steps need not be batch-invariant, then runs it where it wins
RACED = (*KERNELS, INVARIANT_DPBF16)
INVARIANT_CHOICE = "invariant kernel"  # the kept one of the two, in the kernel store under the package key
# compile=True: steps are batch-invariant where that step (on our kernels) costs at most this much of the fast one
EXACT_TOLERANCE = 1.05
EXACT_CHOICE = "batch-invariant"  # the outcome, in the kernel store under the fast steps' package key
FAST = "fast"  # compile=FAST: the fast step even where the batch-invariant one costs no more


def kernel_options(kind: str) -> dict:
    """The inductor options of a CPU kernel variant (one of `VARIANTS`, `INVARIANT` or `INVARIANT_DPBF16`)."""
    if kind == INVARIANT:
        return INVARIANT_KERNELS
    if kind == INVARIANT_DPBF16:
        # inductor fuses other pointwise chains for other buckets and, in a fusion, keeps float32 between ops
        # that eager rounds to bfloat16: with the roundings kept, a fusion changes no bit
        return {**INVARIANT_KERNELS, "emulate_precision_casts": True}
    if kind not in VARIANTS:
        raise ValueError(f"kernel {kind!r}: one of {', '.join(VARIANTS)}")
    base = kind.removesuffix(CONCAT)
    return {**KERNELS[base], "cpp.enable_concat_linear": True} if base != kind else KERNELS[base]


INVARIANCE_PROMPT = 48  # tokens before the chain that checks a batch-invariant step (`HFModel._check_invariance`)


def on_dpbf16(kind: str) -> bool:
    """Whether a compiled step's variant runs its linear maps through our kernel (`DPBF16`)."""
    return DPBF16 in kind.split("+")


def has_fast_bfloat16(device: torch.device | str = "cpu") -> bool:
    """Whether bfloat16 matrix products run natively: a CUDA device that supports them, or a CPU with
    AVX512-BF16 or AMX-BF16 (read from /proc/cpuinfo; elsewhere assumed not)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def default_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """bfloat16 where the hardware has fast bfloat16, else float32."""
    return torch.bfloat16 if has_fast_bfloat16(device or "cpu") else torch.float32


_INVARIANT_ROWS: dict[tuple, int] = {}
MOST_ROWS_CHECKED = 20


@torch.inference_mode()
def invariant_rows(model, most: int = MOST_ROWS_CHECKED) -> int:
    """The fewest rows from which every linear map of `model`, as this machine computes it, gives each row
    the same bits as a product over `most` rows. CPU libraries take another kernel (summing in another order)
    for one row, or a few; a forward padded to this many rows scores a token the same whether it came alone or
    with others. Measured once per set of shapes, dtype, device and thread count."""
    from transformers.pytorch_utils import Conv1D

    layers = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            layers.setdefault((module.in_features, module.out_features), module)
        elif isinstance(module, Conv1D):
            layers.setdefault((module.weight.shape[0], module.nf), module)
    if not layers:
        return 1
    some = next(iter(layers.values())).weight
    key = (tuple(sorted(layers)), some.dtype, str(some.device), torch.get_num_threads(), linears.is_active())
    if key not in _INVARIANT_ROWS:
        gen = torch.Generator().manual_seed(0)
        fewest = 1
        for (width, _), module in layers.items():
            x = torch.randn(1, most, width, generator=gen).to(some.device, module.weight.dtype)
            full = module(x)
            for rows in range(most - 1, fewest - 1, -1):  # down from the top: the first that differs bounds it
                # every row at least once, in products of exactly `rows` rows (whether the order changes a rounding
                # depends on the numbers, so one product is not enough to see it; a shorter last product would
                # test another row count)
                starts = [*range(0, most - rows + 1, rows), most - rows]
                if any(not torch.equal(module(x[:, i : i + rows]), full[:, i : i + rows]) for i in starts):
                    fewest = rows + 1
                    break
        _INVARIANT_ROWS[key] = fewest
    return _INVARIANT_ROWS[key]


@contextlib.contextmanager
def compile_settings(kernels: dict):
    """Compiled steps keep their shapes static (new tokens and rows are bucketed; only the key length is
    dynamic) and may hold one graph per bucket and kernel variant; inductor's autotuning prints no tables.
    `kernels` (inductor options) are set for the call as well as given to `torch.compile`: dynamo reads
    `freezing` when it traces (frozen weights are guarded constants; as a backend option alone they stay graph
    inputs, unpacked)."""
    import torch._dynamo.config as dynamo
    import torch._inductor.config as inductor
    import torch._inductor.select_algorithm as select

    quiet, select.PRINT_AUTOTUNE = select.PRINT_AUTOTUNE, False  # no timing tables between generated tokens
    try:
        with warnings.catch_warnings():
            # inductor's autotuner calls a deprecated storage method; the user can do nothing about it
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
            with (
                dynamo.patch(automatic_dynamic_shapes=False, recompile_limit=64, accumulated_recompile_limit=512),
                inductor.patch(kernels),
            ):
                yield
    finally:
        select.PRINT_AUTOTUNE = quiet
