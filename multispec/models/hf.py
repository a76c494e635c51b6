"""Any transformers causal LM behind the `LanguageModel` interface.

The KV cache is static (`models/static.py`): preallocated buffers written by our attention function, so
a rollback is a length change and a tree commit moves only the accepted entries. Every forward passes
explicit position ids and an additive 4-D mask ([B, 1, n, K], 0 where allowed), built here from the
engine's boolean mask; sliding windows are applied in that mask. With `compile=True` the forward is
compiled by torch inductor once per (rows, bucket of new tokens): new tokens are padded to 1, 2, 4, 8, ...
up to `COMPILED_TOKENS`; longer feeds and the prompt run eagerly. On a CPU the compile freezes the weights, and
each shape's graph is compiled in each of `KERNELS`, the faster of them again with `CONCAT` (products that read
the same input made one), and the one whose whole step ran fastest here is kept (the choice is stored per machine,
model, dtype and thread count), so no kernel choice made on another host is baked in; the kept step is compiled
ahead of time into a package on disk (`packaged.py`), which later processes load. A family whose attention
layers do not go through transformers' attention interface keeps transformers' `DynamicCache`, with one line
saying so.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import statistics
import time
import warnings
from typing import Any

import torch

from ..console import note
from ..machine import cpu_flags, describe_device, kernel_store_path, read_store, write_store_entry
from . import dpbf16, linears, packaged, static
from .base import LanguageModel
from .static import bucket

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
                # every row once, in products of `rows` rows (whether the order changes a rounding depends on
                # the numbers, so one product is not enough to see it)
                if any(
                    not torch.equal(module(x[:, i : i + rows]), full[:, i : i + rows]) for i in range(0, most, rows)
                ):
                    fewest = rows + 1
                    break
        _INVARIANT_ROWS[key] = fewest
    return _INVARIANT_ROWS[key]


class HFModel(LanguageModel):
    keeps_measurements = True  # its cost curves are kept in this machine's store (`cost.forward_cost`)

    def __init__(self, model, tokenizer=None, name: str | None = None, chat: bool = True, compile: bool | str = False):
        if compile not in (False, True, INVARIANT, FAST):
            raise ValueError(f"compile={compile!r}: False, True, {INVARIANT!r} or {FAST!r}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "name_or_path", None) or type(model).__name__
        cfg = model.config
        table = (
            model.get_output_embeddings().weight.shape[0]
            if model.get_output_embeddings() is not None
            else cfg.vocab_size
        )
        # the embedding table may be padded past the tokenizer's vocabulary: only the tokenizer's ids are real
        self.vocab_size = min(len(tokenizer), table) if tokenizer is not None else table
        self.max_length = getattr(cfg, "max_position_embeddings", None)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos is None and tokenizer is not None:
            eos = tokenizer.eos_token_id
        eos = [e for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
        self.eos_token_id = eos[0] if eos else None
        self.stop_token_ids = tuple(int(e) for e in eos)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.use_chat_template = chat
        # sliding-window attention (Mistral, Gemma 2/3, ...): our mask replaces the model's own, so the window
        # is applied here; `mixed`: some layers slide and others attend to everything
        window = getattr(cfg, "sliding_window", None)
        self.sliding_window = window if window and getattr(cfg, "use_sliding_window", True) is not False else None
        kinds = set(getattr(cfg, "layer_types", None) or [])
        if self.sliding_window and kinds and "sliding_attention" not in kinds:
            self.sliding_window = None
        self.mixed_layers = bool(self.sliding_window) and len(kinds) > 1
        self.kv_shapes, why = self._probe()
        self.static = self.kv_shapes is not None
        if not self.static:
            note(f"multispec: {self.name} keeps transformers' dynamic cache, uncompiled ({why})")
        self.compile = bool(compile) and self.static
        # CUDA graphs: on one CUDA device, a step of up to COMPILED_TOKENS new tokens is captured once per shape
        # and cache buffers, then replayed (its kernels launch without Python in between)
        devices = {str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}
        self.graphs = (
            self.static
            and self.device.type == "cuda"
            and len(devices) <= 1
            and os.environ.get("MULTISPEC_CUDA_GRAPHS", "1") != "0"
        )
        self.graph_captures = 0  # graphs captured (a new shape, or new cache buffers)
        self._graphs: dict[tuple, Any] = {}
        self._graph_pool = None
        self.compiles = 0  # compiled graphs made (a new shape, or a recompile)
        # the fallbacks so far, one line each: a compiled or captured step that failed ran again uncompiled or
        # uncaptured, for the rest of that cache's generation only (the model stays as it was for the next)
        self.fallbacks: list[str] = []
        self.compile_seconds = 0.0  # time spent making them (one-time costs, not decoding)
        self._compiled: dict[str, Any] = {}  # a compiled step per kernel variant
        self._packages: dict[tuple[str, tuple[int, int]], Any] = {}  # (variant, shape) -> a step loaded from disk
        self._packaged: bool | None = None
        self._routes: bool | None = None  # whether our kernel (`dpbf16`) takes any of the model's linear maps
        self._weights_key: str | None = None
        # (rows, new tokens) -> the variant of `KERNELS` its compiled step runs; "auto": chosen per shape by timing;
        # INVARIANT: one variant for every shape, batch-invariant (`INVARIANT_KERNELS`)
        self.kernel = INVARIANT if compile == INVARIANT else "auto"
        if self.kernel == INVARIANT and self.compile and self.device.type != "cpu":
            raise ValueError(f"compile={INVARIANT!r} is built and measured for CPUs; {self.device} has no such step")
        self._invariant_kind: str | None = None  # the variant INVARIANT steps run in (`invariant_kind`)
        # compile=True: whether steps are batch-invariant here all the same (`resolve_kernel`; None: not decided)
        self._exact: bool | None = None if compile is True else False
        self.kernels: dict[tuple[int, int], str] = {}
        # INVARIANT: a bucket of new tokens (one row) -> how many of its tokens got other logits than one-token
        # steps when checked on this machine (`_check_invariance`; 0: the same bits)
        self.invariance: dict[int, int] = {}
        self._shapes: set[tuple[str, tuple[int, int]]] = set()
        # a bucket of new tokens -> a larger one whose compiled step ran faster here (one row; set by measuring
        # the cost curve in this process, `multispec.models.cost`); padding rows are masked out and dropped
        self.bucket_route: dict[int, int] = {}
        self._min_rows: int | None = None
        # eager static steps on a CPU: linear maps on weights packed once, where that ran faster here
        # (`linears.pack`, decided at the first eager step; None until then)
        self.packed_linears: bool | None = None

    def eager_packed(self) -> bool:
        """Whether eager static steps run packed linear maps (decided, by timing, on first asking)."""
        if self.packed_linears is None:
            why = linears.packable(self.model) if self.static and not self.compile else "not eager static steps"
            self.packed_linears = why is None and linears.pack(self.model)[0]
        return self.packed_linears

    def _eager_kernels(self):
        """The context eager static steps run in: packed linear maps where `linears.pack` chose them."""
        return linears.active() if self.eager_packed() else contextlib.nullcontext()

    def resolve_kernel(self) -> str:
        """The compiled step's kernel mode ("auto" or INVARIANT), deciding it on first asking: with compile=True,
        where our kernels take every product here, a one-token batch-invariant step on them
        (`INVARIANT_DPBF16`) is timed against the fast one (interleaved, once per machine, kept), and the steps
        are batch-invariant wherever it cost at most EXACT_TOLERANCE times as much: greedy speculative outputs
        then equal greedy `ar`'s in bfloat16 as well."""
        if self._exact is None:
            self._exact = False  # (the race's own steps come back here)
            eligible = (
                self.device.type == "cpu"
                and self.dtype == torch.bfloat16
                and self.offers(DPBF16) is None
                and dpbf16.routes_all(self.model)
            )
            if eligible:
                kept = _stored_entry(self._package_key(), EXACT_CHOICE)
                exact = kept["exact"] if isinstance((kept or {}).get("exact"), bool) else self._race_exact()
                if exact:
                    self.kernel, self._invariant_kind, self._exact = INVARIANT, INVARIANT_DPBF16, True
        return self.kernel

    def _race_exact(self) -> bool:
        key = self._package_key()  # the fast steps' (the choice is kept under it)
        compiled_before, t0 = self.compile_seconds, time.perf_counter()
        try:
            seconds = self._time_one_token(
                {"auto": ("auto", INVARIANT_DPBF16), INVARIANT_DPBF16: (INVARIANT, INVARIANT_DPBF16)}
            )
        finally:
            self.kernel, self._invariant_kind = "auto", None
        # where the fast step's own race kept the batch-invariant variant, the two are one step (timing it against
        # itself would decide by noise)
        exact = INVARIANT_DPBF16 in seconds and (
            self.kernels.get((1, 1)) == INVARIANT_DPBF16
            or seconds[INVARIANT_DPBF16] <= EXACT_TOLERANCE * seconds["auto"]
        )
        _store_entry(key, EXACT_CHOICE, {"exact": exact, "step_ms": {k: round(1e3 * v, 3) for k, v in seconds.items()}})
        self.compile_seconds = compiled_before + time.perf_counter() - t0  # a one-time cost
        note(
            f"multispec: {self.name}, 1 token: "
            + ", ".join(
                f"{'batch-invariant' if k == INVARIANT_DPBF16 else 'fast'} step {1e3 * v:.1f} ms"
                for k, v in seconds.items()
            )
            + f" here; its steps are {'batch-invariant' if exact else 'the fast ones'}"
        )
        return exact

    @torch.inference_mode()
    def _time_one_token(self, settings: dict[str, tuple[str, str]]) -> dict[str, float]:
        """Median seconds of a one-token compiled step after a short prompt in each setting (name -> kernel mode
        and invariant kind, set before its step), each step compiled or loaded and warmed up first, then timed in
        interleaved rounds. A setting whose invariant kind `forward` changed (its step did not compile, a line
        said so) is left out. The steps' invariance checks are not kept."""
        ids = torch.randint(self.vocab_size, (1, INVARIANCE_PROMPT + 1), generator=torch.Generator().manual_seed(0))
        cache = self.new_cache()
        self.forward(cache, ids[:, :-1], logits_to_keep=1)
        past = cache.length
        times: dict[str, list[float]] = {name: [] for name in settings}
        for rounds in (2, CHOICE_ROUNDS):
            for _ in range(rounds):
                for name in list(times):
                    self.kernel, self._invariant_kind = settings[name]
                    start = time.perf_counter()
                    self.forward(cache, ids[:, -1:])
                    elapsed = time.perf_counter() - start
                    cache.crop(past)
                    if self._invariant_kind != settings[name][1]:
                        times.pop(name)
                    elif rounds == CHOICE_ROUNDS:
                        times[name].append(elapsed)
        self.invariance.clear()
        return {name: statistics.median(t) for name, t in times.items() if t}

    def invariant_kind(self) -> str:
        """The variant batch-invariant compiled steps run in: oneDNN on rows padded to `min_rows` (`INVARIANT`),
        or, where our kernel takes every linear map here, whichever of it (`INVARIANT_DPBF16`, rows unpadded)
        and oneDNN ran a one-token step faster on this machine (timed once, on first asking; kept)."""
        if self._invariant_kind is None:
            if self.offers(DPBF16) is not None or not dpbf16.routes_all(self.model):
                self._invariant_kind = INVARIANT
            else:
                kept = (_stored_entry(self._package_key(), INVARIANT_CHOICE) or {}).get("kernel")
                self._invariant_kind = kept if kept in (INVARIANT, INVARIANT_DPBF16) else self._race_invariant()
        return self._invariant_kind

    def _race_invariant(self) -> str:
        """Time a one-token batch-invariant step on oneDNN and on our kernel (`_time_one_token`), keep the faster
        here, and drop the other's package."""
        compiled_before, t0 = self.compile_seconds, time.perf_counter()
        seconds = self._time_one_token({kind: (INVARIANT, kind) for kind in (INVARIANT_DPBF16, INVARIANT)})
        kind = min(seconds, key=seconds.get) if seconds else INVARIANT
        _store_entry(
            self._package_key(),
            INVARIANT_CHOICE,
            {"kernel": kind, "step_ms": {k: round(1e3 * v, 3) for k, v in seconds.items()}},
        )
        for other, shape in [key for key in self._packages if key[0] != kind]:
            self._packages.pop((other, shape))
            packaged.remove(packaged.path_for(self._package_key(), other, shape))
        self.compile_seconds = compiled_before + time.perf_counter() - t0  # a one-time cost
        note(
            f"multispec: {self.name}'s batch-invariant step, 1 token: "
            + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in seconds.items())
            + f" here; keeps {kind}"
        )
        return kind

    def _invariant_padding(self) -> int:
        """Rows a batch-invariant compiled step is padded to."""
        return 1 if self.invariant_kind() == INVARIANT_DPBF16 else self.min_rows

    @property
    def min_rows(self) -> int:
        """Rows (batch rows x new tokens) an eager forward is padded to: `invariant_rows` in bfloat16 and
        float16, where a kernel switch moves a logit by a rounding step often enough to change greedy
        outputs; 1 in float32, whose steeper cost curve would charge every plain step for it."""
        if self._min_rows is None:
            reduced = self.dtype in (torch.bfloat16, torch.float16)
            with self._eager_kernels():
                self._min_rows = invariant_rows(self.model) if reduced else 1
        return self._min_rows

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        dtype: torch.dtype | str = "auto",
        device: str | None = None,
        compile: bool | str = False,
        **kwargs,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        except (OSError, ValueError):  # no usable tokenizer files: ids-only use is still possible
            tokenizer = None
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **kwargs)
        if device is not None:
            model = model.to(device)
        return cls(model, tokenizer, name=str(name_or_path), compile=compile)

    # -- the static cache: does this family write through our attention function? ----------------
    @torch.inference_mode()
    def _probe(self):
        """Per-layer key / value shapes for one row (None and the reason when the family cannot use the
        static cache): run two tokens through our attention function and compare with transformers' path."""
        try:
            static.install(self.model)
        except Exception as e:  # noqa: BLE001 - any refusal means: keep the stock path
            return None, f"attention interface refused: {type(e).__name__}"
        tokens = torch.tensor([[1, 2]], device=self.device) % max(2, self.vocab_size)
        positions = torch.arange(2, device=self.device)[None]
        causal = torch.tensor([[0.0, torch.finfo(torch.float32).min], [0.0, 0.0]], device=self.device)[None, None]
        seen: list = []
        try:
            ours = self.model(
                input_ids=tokens,
                position_ids=positions,
                attention_mask=self._masks(causal, None),
                use_cache=False,
                ms_keys=[],
                ms_probe=seen,
            ).logits.float()
            stock = self.model(input_ids=tokens, use_cache=False).logits.float()
        except Exception as e:  # noqa: BLE001
            return None, f"probe forward failed: {type(e).__name__}: {str(e)[:120]}"
        layers = getattr(self.model.config, "num_hidden_layers", None)
        indices = sorted(i for i, *_ in seen)
        if not seen or indices != list(range(len(seen))) or (layers is not None and len(seen) != layers):
            return None, "its attention layers do not all call transformers' attention interface"
        scale = float(stock.abs().max()) + 1e-6
        apart = float((ours - stock).abs().max())
        if apart / scale > (1e-3 if self.dtype == torch.float32 else 5e-2):
            # in a reduced precision, transformers' own two attention implementations can differ by more than
            # that (bfloat16 flash attention on a GPU rounds the softmax weights; seen on the default target):
            # ours must then be as close to the stock logits as transformers' eager attention is
            noise = self._stock_spread(tokens, stock) if self.dtype != torch.float32 else 0.0
            if apart > 2 * noise:
                return None, "its logits through our attention differ from transformers'"
        return [(k, v, dev) for _, k, v, dev in sorted(seen, key=lambda e: e[0])], ""

    def _stock_spread(self, tokens, stock) -> float:
        """The largest logit difference between transformers' eager attention and its default one (0 where
        eager is not available)."""
        try:
            self.model.set_attn_implementation("eager")
            eager = self.model(input_ids=tokens, use_cache=False).logits.float()
        except Exception:  # noqa: BLE001 - no eager attention: no spread to allow
            return 0.0
        finally:
            self.model.set_attn_implementation(static.NAME)
        return float((eager - stock).abs().max())

    # -- cache ---------------------------------------------------------------------------------
    def new_cache(self) -> Any:
        if not self.static:
            return self._new_dynamic()
        return static.StaticKV(self.kv_shapes, self.dtype, self.device, storage=self.kv_storage())

    def kv_storage(self) -> torch.dtype:
        """The type the static cache holds: bfloat16 where this model's steps are the batch-invariant ones on our
        kernels, whose attention (`dpbf16.attend`) reads bfloat16 as it reads float32 (a bfloat16 model's keys and
        values are bfloat16 numbers: the same bits, half the bytes), else float32. Decided by the steps' kernels,
        as they stand when the cache is made (`prepare`)."""
        softcap = getattr(self.model.config, "attn_logit_softcapping", None)  # (attends through `static.attend`)
        if (
            self.compile
            and self.dtype == torch.bfloat16
            and self.device.type == "cpu"
            and self.kernel == INVARIANT
            and self._invariant_kind == INVARIANT_DPBF16
            and not softcap
            and all(dpbf16.attends(k[3], v[3]) for k, v, _ in self.kv_shapes)
        ):
            return torch.bfloat16
        return torch.float32

    def prepare(self) -> None:
        """Decide the compiled steps' kernels now (a target's runner, before it makes its cache): the cache's
        storage follows them (`kv_storage`). Deciding runs once per machine and is kept."""
        if self.compile and self.static and self.device.type == "cpu":
            if self.resolve_kernel() == INVARIANT:
                self.invariant_kind()

    def crop(self, cache, length: int) -> None:
        if not self.static:
            return self._crop_dynamic(cache, length)
        cache.crop(length)

    def select_rows(self, cache, rows: torch.Tensor) -> None:
        if not self.static:
            return self._select_dynamic(cache, rows)
        cache.select_rows(rows)

    def keep_positions(self, cache, positions: torch.Tensor) -> None:
        if not self.static:
            return self._keep_dynamic(cache, positions)
        cache.keep(positions)

    @property
    def padded_tokens(self) -> int:
        """A compiled step pads up to this many new tokens to a power of two (what its cost curve steps by)."""
        return COMPILED_TOKENS if self.compile or self.graphs else 0

    # -- scoring -------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, cache, tokens, positions=None, mask=None, logits_to_keep=0, fused_prefix=0, batch_invariant=True):
        if not self.static:
            return self._forward_dynamic(cache, tokens, positions, mask, logits_to_keep)
        device = self.device
        b, n = tokens.shape
        past = cache.length
        if cache.rows != b:
            if past:
                raise RuntimeError(f"{b} rows fed to a cache of {cache.rows} rows")
            cache.reserve(cache.capacity, rows=b)
        if (
            past == 0
            and self.compile
            and cache.compiled
            and self.kernel == INVARIANT
            and 0 < fused_prefix < n - 1
            and n - fused_prefix - 1 <= COMPILED_TOKENS
        ):
            return self._prompt_then_steps(
                cache, tokens, positions, mask, logits_to_keep, fused_prefix, batch_invariant
            )
        # a prompt (the first feed) runs eagerly: its length differs from call to call
        compiled = self.compile and cache.compiled and past > 0 and n <= COMPILED_TOKENS
        if compiled and batch_invariant:  # (a draft's forwards are not: its logits decide nothing)
            self.resolve_kernel()
        graphed = self.graphs and cache.captured and past > 0 and n <= COMPILED_TOKENS
        # new entries written: n real, then padding (a bucket for a compiled or captured step; eagerly in a
        # reduced precision, enough rows that every product takes the kernel it takes for many: batch invariance)
        invariant = compiled and self.kernel == INVARIANT
        if compiled:
            width = bucket(max(n, -(-self._invariant_padding() // b)) if invariant else n)
            if b == 1:
                width = self.bucket_route.get(width, width)
        else:
            width = max(n, -(-self.min_rows // b)) if batch_invariant else n
            if graphed:
                width = bucket(width)
        # a compiled graph is specialised on whether the values it reads (whole key blocks) fill the buffer: a
        # buffer always a block longer keeps one graph per bucket as the cache grows
        cache.reserve(static.whole_blocks(past + width) + 1 if compiled else past + width)
        total = past + width
        # a captured step reads every slot of the buffers, so that its shapes stay the same as the cache fills:
        # its mask spans the capacity, and the slots past the new entries are masked (they weigh exactly 0)
        span = cache.capacity if graphed else total
        new = (
            positions.to(device) if positions is not None else torch.arange(past, past + n, device=device).expand(b, n)
        )
        # ids and positions are copied only when padded, or for a compiled graph (guarded on its inputs' strides)
        as_given = width == n and not compiled
        if as_given:
            pos = new
        else:
            pos = torch.empty(b, width, dtype=torch.long, device=device)
            pos[:, :n] = new
            pos[:, n:] = new[:, -1:]
        cache.positions[:, past:total] = pos
        minimum = torch.finfo(torch.float32).min
        windowed = None
        if mask is None and not self.sliding_window:
            # a causal chain, the common step, in two operators: padding rows see causally too (their outputs
            # are dropped, and no real row sees them)
            full = torch.full((width, span), minimum, device=device).triu_(past + 1)[None, None].expand(b, 1, -1, -1)
        else:
            allowed = torch.zeros(b, width, span, dtype=torch.bool, device=device)
            if mask is None:
                allowed[:, :n, :past] = True
                allowed[:, :n, past : past + n] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
            else:
                allowed[:, :n, : past + n] = mask.to(device)
            pad = torch.arange(n, width, device=device)
            allowed[:, pad, past + pad] = True  # padding sees only itself
            full = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill_(~allowed, minimum)[
                :, None
            ]
        if self.sliding_window:
            keys = cache.positions[:, :span]
            inside = allowed & (keys[:, None, :] > pos[:, :, None] - self.sliding_window)
            windowed = torch.zeros(inside.shape, dtype=torch.float32, device=device).masked_fill_(~inside, minimum)[
                :, None
            ]
        if as_given:
            ids = tokens.to(device)
        else:
            ids = torch.zeros(b, width, dtype=torch.long, device=device)
            ids[:, :n] = tokens.to(device)
        slots = torch.arange(past, total, device=device)
        masks = self._masks(full, windowed)
        if graphed:
            try:
                logits = self._run_graphed(ids, pos, masks, slots, cache)
            except Exception as e:  # noqa: BLE001 - a step that cannot be captured still decodes, uncaptured
                # for this cache only: the next generation tries its graphs again
                cache.captured = False
                self._fall_back(
                    f"this generation runs without CUDA graphs: a capture failed ({type(e).__name__}: "
                    f"{' '.join(str(e).split())[:200]})"
                )
                return self.forward(cache, tokens, positions, mask, logits_to_keep, batch_invariant=batch_invariant)
            cache.length = past + n
            logits = logits[:, :n]
            if logits_to_keep:
                logits = logits[:, -logits_to_keep:]
            # the graph's output is overwritten by its next replay: the caller gets its own copy
            return logits[..., : self.vocab_size].to(torch.float32, copy=True)
        if compiled:
            if self.device.type == "cpu" and self.kernel not in ("auto", INVARIANT, *VARIANTS):
                raise ValueError(f"kernel {self.kernel!r}: 'auto', {INVARIANT!r} or one of {', '.join(VARIANTS)}")
            if self._packaging():
                packaged.limit_bytes()  # a bad MULTISPEC_COMPILED_LIMIT_GB is refused, not taken for a failed compile
            try:
                logits = self._run_compiled(ids, pos, masks, slots, cache)
            except Exception as e:  # noqa: BLE001 - a model torch cannot compile still decodes, eagerly
                # nothing is committed before the compiled call returns (the length is set after it), so the
                # same feed runs again from the top: batch-invariant on oneDNN where our kernel's step failed,
                # else eagerly
                # else eagerly; for this cache only (one generation): the model stays as it was, so a failure
                # in one request changes neither the speed nor the tokens of the next
                why = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
                if invariant and (cache.invariant_kind or self._invariant_kind) == INVARIANT_DPBF16:
                    cache.invariant_kind = INVARIANT
                    self._fall_back(
                        f"this generation's batch-invariant steps run on oneDNN: on our kernel a step failed ({why})"
                    )
                    return self.forward(cache, tokens, positions, mask, logits_to_keep, batch_invariant=batch_invariant)
                cache.compiled = False
                self._fall_back(f"this generation runs uncompiled: a compiled step failed ({why})")
                return self.forward(cache, tokens, positions, mask, logits_to_keep, batch_invariant=batch_invariant)
            if invariant and b == 1 and width not in self.invariance:
                logits = logits.clone()  # the probe runs steps of its own before this feed returns
                self._check_invariance(width)
        else:
            keep = min(n, logits_to_keep or n)
            # a prompt's start attends through torch's fused attention (one pass where the batch-invariant
            # attention makes a dozen per block of queries): its tokens' logits are not kept, and every method
            # feeds the prompt alike; the tokens after it are attended as in a step
            fused = fused_prefix if past == 0 and not self.sliding_window and keep <= n - fused_prefix else 0
            # in a reduced precision on a CPU, where the rest of the step is batch-invariant, each query's last
            # few values are summed so that a tree's layout does not change them (`static.splits`)
            reduced = self.dtype in (torch.bfloat16, torch.float16)
            split = static.splits(pos[:, fused:]) if batch_invariant and reduced and device.type == "cpu" else None
            with self._eager_kernels():
                logits = self._step(ids, pos, masks, slots, cache.keys, cache.values, keep + width - n, fused, split)
            cache.length = past + n
            return logits[:, :keep, : self.vocab_size].float()  # the padding rows come last
        cache.length = past + n
        logits = logits[:, :n]
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return logits[..., : self.vocab_size].float()

    def _prompt_then_steps(self, cache, tokens, positions, mask, logits_to_keep, fused_prefix, batch_invariant):
        """A first feed of a prompt (`fused_prefix` + 1 tokens) and tokens after it, on the batch-invariant
        compiled step: the prompt eagerly, as a feed of the prompt alone runs, and the rest in a compiled step,
        as it runs when the prompt came alone (an eager step gives a token other bits than a compiled one, so
        scoring the first drafts with the prompt would give their cache entries bits that `ar` never sees)."""
        n = tokens.shape[1]
        p = fused_prefix + 1
        keep = logits_to_keep or n
        after = min(keep, n - p)  # logits kept from each part
        before = keep - after
        head = self.forward(
            cache,
            tokens[:, :p],
            None if positions is None else positions[:, :p],
            None if mask is None else mask[:, :p, :p],
            max(before, 1),
            fused_prefix,
            batch_invariant,
        )
        tail = self.forward(
            cache,
            tokens[:, p:],
            None if positions is None else positions[:, p:],
            None if mask is None else mask[:, p:, :n],
            after,
            0,
            batch_invariant,
        )
        return torch.cat([head[:, head.shape[1] - before :], tail], 1)

    def _run_graphed(self, ids, positions, masks, slots, cache):
        """The step (compiled when `compile`, else eager) as a CUDA graph, captured on first use for these
        shapes and these cache buffers (a graph reads and writes the buffers it was captured with: a new cache
        at the same addresses, as the caching allocator often gives, reuses it), then replayed. Returns the
        graph's own logits [rows, width, vocab]."""
        named = sorted(masks.items()) if isinstance(masks, dict) else [(None, masks)]
        buffers = (*cache.key_buffers, *cache.value_buffers)
        key = (
            tuple(ids.shape),
            tuple((k, tuple(m.shape)) for k, m in named),
            tuple(b.data_ptr() for b in buffers),
            tuple(tuple(b.shape) for b in buffers),
        )
        entry = self._graphs.pop(key, None)
        if entry is None:
            entry = self._capture(ids, positions, named, slots, cache)
        self._graphs[key] = entry  # most recently used last
        while len(self._graphs) > GRAPHS_KEPT:
            self._graphs.pop(next(iter(self._graphs)))
        inputs, output, graph = entry
        for held, given in zip(inputs, (ids, positions, *(m for _, m in named), slots), strict=True):
            held.copy_(given)
        graph.replay()
        return output

    def _capture(self, ids, positions, named, slots, cache):
        t0 = time.perf_counter()
        compiled_before = self.compile_seconds
        inputs = [
            torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)
            for t in (ids, positions, *(m for _, m in named), slots)
        ]

        def step():
            ids, positions, *masks, slots = inputs
            masks = masks[0] if named[0][0] is None else {k: m for (k, _), m in zip(named, masks, strict=True)}
            if self.compile:
                return self._run_compiled(ids, positions, masks, slots, cache)
            return self._step(ids, positions, masks, slots, cache.keys, cache.values)

        # the warm-up runs write the same entries at the same slots as the replay will
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP):
                step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._graph_pool is None:
            # one memory pool for all of a model's graphs: they never run at once, and each replay's output is
            # copied out before the next
            self._graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            output = step()
        self.graph_captures += 1
        # one-time cost, like a compile (a compile during the warm-up is counted once)
        self.compile_seconds = compiled_before + time.perf_counter() - t0
        return inputs, output, graph

    def _masks(self, full, windowed):
        if windowed is None:
            return full
        return {"full_attention": full, "sliding_attention": windowed} if self.mixed_layers else windowed

    def _step(self, ids, positions, masks, slots, keys, values, logits_to_keep=0, fused=0, split=None, exact=False):
        extra = {"ms_fused": fused} if fused else {}
        if split is not None:
            extra["ms_splits"] = split
        if exact:
            extra["ms_exact"] = True
        return self.model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=masks,
            use_cache=False,
            logits_to_keep=logits_to_keep,
            ms_keys=keys,
            ms_values=values,
            ms_slots=slots,
            **extra,
        ).logits

    def _check_invariance(self, width: int) -> None:
        """The batch-invariant step for `width` new tokens (one row) against one-token steps, once per bucket on
        this machine (the outcome is kept beside the kernel choices): a chain of `width` tokens after a short
        prompt, scored in one step and one token at a time, must get the same logits bit for bit. Batch
        invariance rests on kernels that do not change with the rows (`INVARIANT_KERNELS`, `min_rows` measured on
        the eager kernels); where this machine's do, a line says so, and `invariance` keeps the count."""
        self.invariance[width] = 0  # the probe's own feeds come back through `forward`
        if width <= bucket(self._invariant_padding()):
            return  # the one-token step's own bucket
        differing = _stored_check(self, width)
        if differing is None:
            compiled_before, t0 = self.compile_seconds, time.perf_counter()
            differing = self._probe_invariance(width)
            _store_check(self, width, differing)
            # a one-time cost, kept out of decoding time as compiling is
            self.compile_seconds = compiled_before + time.perf_counter() - t0
        self.invariance[width] = differing
        if differing:
            note(
                f"multispec: {self.name}'s batch-invariant step for {width} new tokens gave {differing} of {width} "
                "tokens other logits than one-token steps on this machine: its kernels change with the rows "
                "here, and greedy speculative outputs may differ from greedy ar's"
            )

    def _probe_invariance(self, width: int) -> int:
        """Of a chain of `width` random tokens after a short prompt, how many get other logits scored in one
        forward than one token at a time (bit for bit)."""
        ids = torch.randint(self.vocab_size, (1, INVARIANCE_PROMPT + width), generator=torch.Generator().manual_seed(0))
        prompt, chain = ids[:, :INVARIANCE_PROMPT], ids[:, INVARIANCE_PROMPT:]
        cache = self.new_cache()
        self.forward(cache, prompt, logits_to_keep=1)
        whole = self.forward(cache, chain)[0]
        cache = self.new_cache()
        self.forward(cache, prompt, logits_to_keep=1)
        steps = torch.cat([self.forward(cache, chain[:, i : i + 1])[0] for i in range(width)])
        return int((whole != steps).any(-1).sum())

    def _invariant_step(self, ids, positions, masks, slots, keys, values):
        # with splits, attention runs through the batch-invariant operator (`static.attention`); they are a
        # function of the positions, computed in the graph, so the step takes the plain step's arguments
        return self._step(ids, positions, masks, slots, keys, values, 0, 0, static.splits(positions))

    def _exact_step(self, ids, positions, masks, slots, keys, values):
        # on our kernels, attention runs through our invariant operator where it takes the heads (`dpbf16.attend`;
        # `static.attention` falls back to the split one elsewhere)
        return self._step(ids, positions, masks, slots, keys, values, 0, 0, static.splits(positions), exact=True)

    def _step_for(self, kind: str):
        """The function a kernel variant's compiled step runs."""
        if kind == INVARIANT_DPBF16:
            return self._exact_step
        return self._invariant_step if kind == INVARIANT else self._step

    def _fall_back(self, why: str) -> None:
        self.fallbacks.append(why)
        note(f"multispec: {self.name}: {why}")

    def _run_compiled(self, ids, positions, masks, slots, cache):
        args = (ids, positions, masks, slots, cache.keys, cache.values)
        shape = (ids.shape[0], ids.shape[1])
        if self.kernel == INVARIANT:
            kind = cache.invariant_kind or self.invariant_kind()
        else:
            kind = self.kernels.get(shape)
        if kind is None:
            if self.kernel != "auto" or self.device.type != "cpu":
                kind = self.kernel
            else:
                entry = _stored_choice(self, shape)
                if entry is None or self.offers(entry["kernel"]) is not None:
                    # first use of this shape on this machine (or its kept variant does not run in this process,
                    # as our kernel switched off): compile every variant that runs, keep the fastest
                    return self._choose_kernel(shape, args)
                kind = entry["kernel"]
                if self._untried(entry):  # a variant this machine could not run when it chose (added since)
                    return self._choose_kernel(shape, args, stored=entry)
            self.kernels[shape] = kind
        return self._call_compiled(kind, shape, args)

    def offers(self, kind: str) -> str | None:
        """None where kernel variant `kind` (of `KERNELS`) can run this model's compiled steps here, else why
        not."""
        if kind == INVARIANT_DPBF16:
            why = self.offers(DPBF16)
            if why is None and not dpbf16.routes_all(self.model):
                why = "our kernel does not take every linear map of the model"
            return why
        if kind.removesuffix(CONCAT) != DPBF16:
            return None
        if self.device.type != "cpu" or self.dtype != torch.bfloat16:
            return "it multiplies bfloat16 on a CPU"
        if not self._packaging():
            return "it runs in packaged steps only"
        if self._routes is None:  # (asked at every compiled call)
            self._routes = dpbf16.routes(self.model)
        return dpbf16.unavailable() if self._routes else "the model has no linear map it takes"

    def _untried(self, entry: dict) -> list[str]:
        """The variants a stored choice would have raced had they run then (those of `KERNELS`, and the kept one
        with `CONCAT`), that run here but were neither timed nor failed."""
        kept = entry["kernel"]
        kinds = (*RACED, *(() if kept.endswith(CONCAT) else (kept + CONCAT,)))
        return [k for k in kinds if k not in _tried(entry) and self.offers(k) is None]

    def _call_compiled(self, kind, shape, args):
        from torch._dynamo.utils import counters

        t0 = time.perf_counter()  # a process's first torch.compile imports dynamo and inductor (~0.8 s): one-time too
        kernels = kernel_options(kind) if self.device.type == "cpu" else {}
        if on_dpbf16(kind) and self.offers(DPBF16) is not None:
            raise ValueError(f"kernel {kind!r} does not run here: {self.offers(DPBF16)}")
        if self._packaging():
            # a package takes the cache's buffers in the type they were exported with: one per storage type
            storage = args[4][0].dtype
            stored = kind if storage == torch.float32 else f"{kind}-kv-{str(storage).removeprefix('torch.')}"
            step = self._packages.get((stored, shape)) or self._package(kind, shape, args, kernels, t0, stored)
            if step is not None:
                ids, positions, masks, slots, keys, values = args
                masks = {k: m.contiguous() for k, m in masks.items()} if isinstance(masks, dict) else masks.contiguous()
                return step(ids, positions, masks, slots, keys, values)
        ids, positions, masks, slots, keys, values = args
        for m in masks.values() if isinstance(masks, dict) else (masks,):
            torch._dynamo.mark_dynamic(m, m.dim() - 1)  # the key length grows every step: one graph for all
        for buffer in (*keys, *values):
            if 2 not in getattr(buffer, "_dynamo_dynamic_indices", ()):  # marked once per buffer (~6 us a call)
                torch._dynamo.mark_dynamic(buffer, 2)
        if kind not in self._compiled:
            # Each model and variant keeps its own compiled steps (isolated: dynamo otherwise shares one cache
            # among the compiles of a function). Within them, dynamo's guards on the model's modules are dropped:
            # the weights are frozen into the graph and the modules never change while it decodes, and checking
            # a few hundred guards took about 0.8 ms of a target step here; guards on the inputs stay.
            isolated = {"isolate_recompiles": True} if _COMPILE_ISOLATES else {}  # torch < 2.13 lacks it
            self._compiled[kind] = torch.compile(
                self._step_for(kind),
                dynamic=None,
                **isolated,
                options={**kernels, "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe},
            )
        what = f" ({kind} kernels)" if self.device.type == "cpu" else ""
        if (kind, shape) not in self._shapes:
            self._shapes.add((kind, shape))
            note(
                f"multispec: compiling {self.name} for {shape[0]} x {shape[1]} new tokens{what} (once per shape and "
                "process) ..."
            )
        graphs = counters["stats"]["unique_graphs"]
        with _compile_settings(kernels):
            logits = self._compiled[kind](*args)
        if counters["stats"]["unique_graphs"] != graphs:
            seconds = time.perf_counter() - t0
            self.compiles += counters["stats"]["unique_graphs"] - graphs
            self.compile_seconds += seconds
            note(f"multispec: compiled in {seconds:.0f} s")
        return logits

    def _choose_kernel(self, shape, args, stored: dict | None = None):
        """Compile the shape's step in every variant of `RACED` that runs here, time each whole step in place
        (the same feed, interleaved rounds), then the fastest with `CONCAT` against itself (where it has that
        form); keep the fastest here. With `stored` (a choice an earlier process made without some variant),
        only the kept one and the variants untried are raced. The last call runs the kept variant, so its logits
        and the cache entries it wrote are the kept variant's. All of it is a one-time cost."""
        t0 = time.perf_counter()
        compiled_before = self.compile_seconds
        failed: list[str] = []
        if stored is None:
            seconds = self._race(shape, args, [k for k in RACED if self.offers(k) is None], failed)
        else:
            seconds = self._race(shape, args, [stored["kernel"], *self._untried(stored)], failed)
        best = min(seconds, key=seconds.get)
        tried = {*seconds, *failed, *(() if stored is None else _tried(stored))}
        if not best.endswith(CONCAT) and best + CONCAT not in tried:
            seconds |= self._race(shape, args, [best, best + CONCAT], failed)  # the kept one timed again beside it
        kind = min(seconds, key=seconds.get)
        self.kernels[shape] = kind
        _store_kernel(self, shape, kind, seconds, failed, before=None if stored is None else stored)
        # only the kept variant's package stays on disk (and a one-token batch-invariant step's: `_race_exact`
        # times it next)
        for other in (*VARIANTS, INVARIANT_DPBF16):
            if (
                other != kind
                and self._packages.pop((other, shape), None) is not None
                and (other, shape) != (INVARIANT_DPBF16, (1, 1))
            ):
                packaged.remove(packaged.path_for(self._package_key(), other, shape))
        logits = self._call_compiled(kind, shape, args)
        self.compile_seconds = compiled_before + time.perf_counter() - t0
        note(
            f"multispec: {self.name} {shape[0]} x {shape[1]}: "
            + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in seconds.items())
            + f" per step here; keeps {kind}"
        )
        return logits

    def _race(self, shape, args, kinds: list[str], failed: list[str]) -> dict[str, float]:
        """Median seconds of a whole step of each variant (compiled first where it is not), interleaved. Our own
        kernel (`DPBF16`) is left out, and added to `failed`, where its step does not compile."""
        for kind in list(kinds):
            try:
                self._call_compiled(kind, shape, args)
                self._call_compiled(kind, shape, args)  # lazy initialisation after a compile is not the step's cost
            except Exception as e:  # noqa: BLE001 - the other variants run the step
                if not on_dpbf16(kind) or len(kinds) == 1:
                    raise
                note(
                    f"multispec: {self.name} {shape[0]} x {shape[1]}: left out the {kind} kernels "
                    f"({type(e).__name__}: {' '.join(str(e).split())[:200]})"
                )
                kinds.remove(kind)
                failed.append(kind)
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(CHOICE_ROUNDS):
            for kind in kinds:
                start = time.perf_counter()
                self._call_compiled(kind, shape, args)
                times[kind].append(time.perf_counter() - start)
        return {kind: statistics.median(t) for kind, t in times.items()}

    def _packaging(self) -> bool:
        """Whether compiled steps are kept on disk (`models/packaged.py`): on a CPU, for a model on one device,
        unless turned off or found not to export."""
        if self._packaged is None:
            devices = set((getattr(self.model, "hf_device_map", None) or {}).values())
            self._packaged = self.device.type == "cpu" and len(devices) <= 1 and packaged.enabled()
        return self._packaged

    def _package_key(self) -> str:
        if self._weights_key is None:
            self._weights_key = packaged.weights_fingerprint(self.model)
        return f"{_kernel_key(self)}|weights={self._weights_key}"

    def _package(self, kind, shape, args, kernels, t0, stored=None):
        """This shape's compiled step in variant `kind`, loaded from this machine's packages or compiled into
        one (a one-time cost either way), kept as `stored` (the variant and the cache's storage type); None where
        the model does not export (it is then compiled in memory, per process, by torch.compile)."""
        stored = stored or kind
        path = packaged.path_for(self._package_key(), stored, shape)
        step = packaged.load(path)  # (our kernel's operator is loaded by then: `offers`, in `_call_compiled`)
        what = f"{self.name} for {shape[0]} x {shape[1]} new tokens ({kind} kernels)"
        if step is None:
            note(f"multispec: compiling {what} (once per shape on this machine; kept in {path.parent}) ...")
            routed = (
                dpbf16.routed(self.model, concat=kind.endswith(CONCAT)) if on_dpbf16(kind) else contextlib.nullcontext()
            )
            try:
                with _compile_settings(kernels), routed:
                    packaged.build(path, self._package_key(), self.model, self._step_for(kind), args, kernels)
                step = packaged.load(path)
                if step is None:
                    raise RuntimeError(f"the package written to {path} does not load")
            except Exception as e:  # noqa: BLE001 - torch.compile in this process still compiles most models
                if on_dpbf16(kind):  # our kernel runs only in packages; the others may still export
                    raise
                self._packaged = False
                note(
                    f"multispec: {self.name} is compiled in memory, per process: it does not export "
                    f"({type(e).__name__}: {' '.join(str(e).split())[:200]})"
                )
                return None
            self.compiles += 1
            note(
                f"multispec: compiled in {time.perf_counter() - t0:.0f} s ({path.stat().st_size / 1e6:.0f} MB on disk)"
            )
            outdated = packaged.prune_stale()
            if outdated:
                note(
                    f"multispec: removed {len(outdated)} compiled step(s) of an older graph "
                    f"({sum(p['bytes'] for p in outdated) / 1e6:.0f} MB): this version compiles its own"
                )
            removed = packaged.prune(keep=path)
            if removed:
                note(
                    f"multispec: removed {len(removed)} least recently used compiled step(s) "
                    f"({sum(p['bytes'] for p in removed) / 1e6:.0f} MB) to stay within "
                    f"{packaged.LIMIT_VARIABLE}={packaged.limit_bytes() / 1e9:g}"
                )
        else:
            note(f"multispec: loaded the compiled step of {what} in {time.perf_counter() - t0:.1f} s")
        self.compile_seconds += time.perf_counter() - t0
        self._packages[(stored, shape)] = step
        return step

    # -- transformers' DynamicCache, for families that cannot use the static one -------------------
    def _new_dynamic(self):
        from transformers import DynamicCache

        if self.sliding_window:
            # full-length layers: trees and commits index every position, so sliding layers must not drop
            # old entries; the window is applied through the mask. `key_positions`: each entry's position id
            cache = DynamicCache()
            cache.key_positions = torch.empty(1, 0, dtype=torch.long, device=self.device)
            return cache
        return DynamicCache(config=self.model.config)

    def _crop_dynamic(self, cache, length: int) -> None:
        if self.sliding_window:
            cache.key_positions = cache.key_positions[:, :length]
        for layer in cache.layers:
            if layer.is_initialized and layer.keys.shape[-2] > length:
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]

    def _select_dynamic(self, cache, rows: torch.Tensor) -> None:
        rows = rows.to(self.device)
        if self.sliding_window:
            cache.key_positions = cache.key_positions.expand(int(rows.max()) + 1, -1)[rows]
        for layer in cache.layers:
            if layer.is_initialized:
                layer.keys = layer.keys.index_select(0, rows)
                layer.values = layer.values.index_select(0, rows)

    def _keep_dynamic(self, cache, positions: torch.Tensor) -> None:
        positions = positions.to(self.device)
        per_row = positions.dim() == 2
        if self.sliding_window:
            kp = cache.key_positions
            cache.key_positions = (
                kp.expand(positions.shape[0], -1).gather(1, positions) if per_row else kp[:, positions]
            )
        for layer in cache.layers:
            if not layer.is_initialized:
                continue
            if per_row:  # keys [B, heads, L, d]: row b keeps positions[b]
                index = positions[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
                layer.keys = layer.keys.gather(2, index)
                layer.values = layer.values.gather(2, index)
            else:
                layer.keys = layer.keys.index_select(-2, positions)
                layer.values = layer.values.index_select(-2, positions)

    def _forward_dynamic(self, cache, tokens, positions=None, mask=None, logits_to_keep=0):
        kwargs = {}
        if positions is not None:
            kwargs["position_ids"] = positions.to(self.device)
        if self.sliding_window:
            b, n = tokens.shape
            past = cache.key_positions.shape[1]
            new = (
                positions.to(self.device)
                if positions is not None
                else torch.arange(past, past + n, device=self.device).expand(b, n)
            )
            keys = torch.cat([cache.key_positions.expand(b, -1), new.expand(b, -1)], 1)
            cache.key_positions = keys
        if mask is not None:
            mask = mask.to(self.device)
            kwargs["attention_mask"] = self._additive(mask)
            if self.sliding_window:  # a key is in the window when its position is within `window` of the query's
                windowed = self._additive(mask & (keys[:, None, :] > new[:, :, None] - self.sliding_window))
                kwargs["attention_mask"] = (
                    {"full_attention": kwargs["attention_mask"], "sliding_attention": windowed}
                    if self.mixed_layers
                    else windowed
                )
        out = self.model(
            input_ids=tokens.to(self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )
        return out.logits[..., : self.vocab_size].float()

    def _additive(self, mask: torch.Tensor) -> torch.Tensor:
        """bool [B, n, K] -> additive [B, 1, n, K]: 0 where allowed, the dtype's minimum elsewhere."""
        additive = torch.zeros(mask.shape, dtype=self.dtype, device=self.device)
        additive.masked_fill_(~mask, torch.finfo(self.dtype).min)
        return additive[:, None]

    # -- text ----------------------------------------------------------------------------------
    def encode(self, text: str, chat: bool = True) -> list[int]:
        if self.tokenizer is None:
            return super().encode(text, chat)
        if chat and self.use_chat_template and getattr(self.tokenizer, "chat_template", None):
            return self.encode_chat([{"role": "user", "content": text}])
        return self.tokenizer(text)["input_ids"]

    def encode_chat(self, messages: list[dict]) -> list[int]:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{self.name} has no chat template: send plain text (completions) instead")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def decode(self, ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(ids, skip_special_tokens=True)


@contextlib.contextmanager
def _compile_settings(kernels: dict):
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


def _kernel_key(model) -> str:
    from .cost import cost_key

    return f"{cost_key(model, kernels=False)}|{describe_device(model.device)}"


def _kernel_store():
    return kernel_store_path()


def _stored_entry(key: str, name: str) -> dict | None:
    """Entry `name` under `key` in this machine's kernel store, if an earlier process wrote one."""
    choices = read_store(_kernel_store()).get(key)
    entry = choices.get(name) if isinstance(choices, dict) else None
    return entry if isinstance(entry, dict) else None


def _store_entry(key: str, name: str, entry: dict) -> None:
    store = _kernel_store()
    choices = read_store(store).get(key)
    choices = choices if isinstance(choices, dict) else {}
    choices[name] = entry
    write_store_entry(store, key, choices)


def _stored_choice(model, shape) -> dict | None:
    """The kernel choice an earlier process on this machine stored for this shape (kernel, step_ms, ...), if any
    names a variant this version has."""
    entry = _stored_entry(_kernel_key(model), f"{shape[0]}x{shape[1]}")
    return entry if entry is not None and entry.get("kernel") in (*VARIANTS, INVARIANT_DPBF16) else None


def _tried(entry: dict) -> set[str]:
    """The variants a stored kernel choice timed, or found not to compile, in any race."""
    return {*entry.get("step_ms", {}), *entry.get("before_ms", {}), *entry.get("failed", [])}


def _stored_check(model, width: int) -> int | None:
    """`HFModel._check_invariance`'s outcome for this bucket from an earlier process on this machine, if any
    (keyed with the weights: a check is of one model's step)."""
    differing = (_stored_entry(model._package_key(), f"{model.invariant_kind()} 1x{width}") or {}).get("differing")
    return differing if isinstance(differing, int) else None


def _store_check(model, width: int, differing: int) -> None:
    _store_entry(model._package_key(), f"{model.invariant_kind()} 1x{width}", {"differing": differing, "of": width})


def _store_kernel(
    model, shape, kind: str, seconds: dict[str, float], failed: list[str], before: dict | None = None
) -> None:
    """The kept variant, the step times of the race (ms) and the variants that failed to compile; `before`: the
    choice an earlier process stored, which this race redid with variants it lacked (its times: `before_ms`)."""
    entry = {"kernel": kind, "step_ms": {k: round(1e3 * v, 3) for k, v in seconds.items()}}
    if failed or before:
        entry["failed"] = sorted({*failed, *(before or {}).get("failed", [])})
    if before:
        entry["before_ms"] = {**before.get("before_ms", {}), **before.get("step_ms", {})}
    _store_entry(_kernel_key(model), f"{shape[0]}x{shape[1]}", entry)
