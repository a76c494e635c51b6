"""Any transformers causal LM behind the `LanguageModel` interface (the package's note says how its parts fit)."""

from __future__ import annotations

import contextlib
import copy
import os
import threading
from typing import Any

import torch

from ...console import note
from .. import dpbf16, linears, packaged, static, vocab
from ..base import LanguageModel
from ..static import bucket
from . import background
from .background import AUTO
from .compiled import CompiledSteps
from .dynamic import DynamicSteps
from .graphs import CapturedSteps
from .inputs import StepInputs, packed_inputs, step_inputs
from .kernels import COMPILED_TOKENS, FAST, INVARIANT, INVARIANT_DPBF16, VARIANTS, invariant_rows
from .lean import LeanLlama

# in a packed step over a batch, rows with at most this many new tokens attend in one padded group over the batch's
# rows; a wider one (a prompt's chunk, a large tree) attends alone, so that the others are not padded to it
NARROW_TOKENS = 8

MAX_HEADS = 4  # cut output heads (`with_head_rows`) a model keeps


class HFModel(LanguageModel):
    keeps_measurements = True  # its cost curves are kept in this machine's store (`cost.forward_cost`)

    def __init__(
        self,
        model,
        tokenizer=None,
        name: str | None = None,
        chat: bool = True,
        compile: bool | str = False,
        source: str | None = None,
    ):
        if compile not in (False, True, INVARIANT, FAST, AUTO):
            raise ValueError(f"compile={compile!r}: False, True, {INVARIANT!r}, {FAST!r} or {AUTO!r}")
        # where it was loaded from (a default model's name, a hub id or a folder): what a background compile
        # worker loads (`background.py`); None for a model built in memory
        self.source = source
        self.draft_vocab: int | None = None  # a cut head's rows, where a worker can cut it again (`with_head_rows`)
        # compile="auto": eager until `background.settle` decides for this process (the loader calls it, knowing
        # whether the model is a target or a draft)
        self.auto_compile = compile == AUTO
        compile = False if compile == AUTO else compile
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
        # how often the target writes each token ([vocab_size] counts, kept beside a draft: `models.vocab`)
        self.token_counts: torch.Tensor | None = None
        self._heads: dict[tuple[int, ...], HFModel] = {}  # `with_head_rows`: the cut heads made, by their ids
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
        self.compiles = 0  # compiled graphs made (a new shape, or a recompile)
        self.compile_seconds = 0.0  # time spent making them (one-time costs, not decoding)
        # the fallbacks so far, one line each: a compiled or captured step that failed ran again uncompiled or
        # uncaptured, for the rest of that cache's generation only (the model stays as it was for the next)
        self.fallbacks: list[str] = []
        # the parts, by composition: compiled steps and their kernels, CUDA graphs, transformers' dynamic cache.
        # "auto": each shape's kernel chosen by timing; INVARIANT: one batch-invariant variant for every shape
        kernel = INVARIANT if compile == INVARIANT else "auto"
        if kernel == INVARIANT and self.compile and self.device.type != "cpu":
            raise ValueError(f"compile={INVARIANT!r} is built and measured for CPUs; {self.device} has no such step")
        self.steps = CompiledSteps(self, kernel, exact=None if compile is True else False)
        self.graphed = CapturedSteps(self)
        self.dynamic = DynamicSteps(self)
        # a bucket of new tokens -> a larger one whose compiled step ran faster here (one row; set by measuring
        # the cost curve in this process, `multispec.models.cost`); padding rows are masked out and dropped
        self.bucket_route: dict[int, int] = {}
        self._min_rows: int | None = None
        # eager static steps on a CPU: linear maps on weights packed once, where that ran faster here
        # (`linears.pack`, decided at the first eager step; None until then)
        self.packed_linears: bool | None = None
        self._batch_rows: int | None = None
        self._kernel_attention: bool | None = None
        self._lean: LeanLlama | bool | None = None  # `lean()`: decided once the linear maps are

    def eager_packed(self) -> bool:
        """Whether eager static steps run packed linear maps (decided, by timing, on first asking; a compiled
        model's eager steps, its fall-backs, run the plain ones)."""
        return not self.compile and self.rows_packed()

    def rows_packed(self) -> bool:
        """Whether batched steps (`forward_rows`, eager whether or not the model is compiled) run packed linear
        maps (decided, by timing, on first asking)."""
        if self.packed_linears is None:
            why = linears.packable(self.model) if self.static else "no static cache"
            self.packed_linears = why is None and linears.pack(self.model)[0]
        return self.packed_linears

    def kernel_attention(self) -> bool:
        """Whether eager steps, single or batched, attend through our kernel (`dpbf16.attend`, and
        `dpbf16.attend_tokens` in a batch: the same bits for a row): bfloat16 on a CPU where it runs, heads it
        takes, no sliding window. Its sums keep one order whatever the rows and a tree's layout (so no padded
        query rows, no float64 tail), and a sequence gets the same logits alone and in a batch."""
        if self._kernel_attention is None:
            cfg = self.model.config
            heads = getattr(cfg, "num_attention_heads", 0) or 1
            head = getattr(cfg, "head_dim", None) or getattr(cfg, "hidden_size", 0) // heads
            self._kernel_attention = (
                self.static
                and self.dtype == torch.bfloat16
                and self.device.type == "cpu"
                and not self.sliding_window
                and not getattr(cfg, "attn_logit_softcapping", None)
                and dpbf16.attends_tokens(head, head)
                and dpbf16.unavailable() is None
            )
        return self._kernel_attention

    def lean(self) -> LeanLlama | None:
        """The step of one kernel call per layer (`lean.LeanLlama`) that eager steps with our attention run, where
        this model takes it (decided once its linear maps are; `MULTISPEC_LEAN=0` keeps transformers' forward)."""
        if self._lean is None and self.packed_linears is not None:
            why = "MULTISPEC_LEAN=0" if os.environ.get("MULTISPEC_LEAN", "1") == "0" else LeanLlama.why_not(self)
            self._lean = LeanLlama(self) if why is None else False
        return self._lean or None

    def _eager_kernels(self):
        """The context eager static steps run in: packed linear maps where `linears.pack` chose them."""
        return linears.active() if self.eager_packed() else contextlib.nullcontext()

    def _row_kernels(self):
        """The context batched steps run in: packed linear maps where `linears.pack` chose them."""
        return linears.active() if self.rows_packed() else contextlib.nullcontext()

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

    def enable_compile(self) -> None:
        """Compiled steps from now on, as compile=True gives (`background.settle`, before any forward)."""
        self.compile = self.static
        self.steps = CompiledSteps(self, "auto", exact=None)

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
        loaded = cls(model, tokenizer, name=str(name_or_path), compile=compile, source=str(name_or_path))
        if os.path.isdir(name_or_path):
            loaded.token_counts = vocab.read_token_counts(name_or_path)
        return loaded

    def with_head_rows(self, ids: torch.Tensor, draft_vocab: int | None = None) -> HFModel:
        """This model with an output head of only the rows `ids` ([n]: its logits are those tokens', in that order),
        sharing every other weight (a reduced draft vocabulary, `multispec.models.vocab`).

        Args:
            ids: [n] token ids, the head's rows in order.
            draft_vocab: n, where `ids` are this model's n most frequent tokens (`vocab.reduce_vocab`), which a
                background worker can cut again from the same files.

        Returns:
            An `HFModel` of n logits a position. Of a model made with `compile="auto"`, it is settled as the model
            was (`background.settle`): compiled where its steps are kept here, else eager while a worker makes
            them (never a compile in the foreground of a first run)."""
        key = tuple(ids.tolist())
        if key in self._heads:
            return self._heads[key]
        head = self.model.get_output_embeddings()
        if not isinstance(head, torch.nn.Linear):
            raise ValueError(f"{self.name}'s output head is not a linear map: its vocabulary cannot be reduced")
        ids = ids.to(head.weight.device)
        small = torch.nn.Linear(
            head.in_features,
            ids.numel(),
            bias=head.bias is not None,
            device=head.weight.device,
            dtype=head.weight.dtype,
        )
        with torch.no_grad():
            small.weight.copy_(head.weight[ids])
            if head.bias is not None:
                small.bias.copy_(head.bias[ids])
        shell = copy.copy(self.model)  # the same layers; only the head differs
        shell._modules = dict(self.model._modules)
        shell.set_output_embeddings(small)
        # made as this model was: "auto" settles it below, as the loader settled this one
        compile = INVARIANT if self.steps.kernel == INVARIANT and self.compile else self.compile
        compile = AUTO if self.auto_compile else compile
        if len(self._heads) >= MAX_HEADS:  # each holds a copy of its rows: a bounded number are kept
            self._heads.pop(next(iter(self._heads)))
        cut = HFModel(
            shell,
            None,
            name=f"{self.name}[head={ids.numel()}]",
            chat=self.use_chat_template,
            compile=compile,
            source=self.source if draft_vocab else None,
        )
        cut.draft_vocab = draft_vocab
        if cut.auto_compile:
            background.settle(cut, "draft")
        self._heads[key] = cut
        return cut

    def decoder_layers(self) -> torch.nn.ModuleList:
        """The model's decoder layers, in order (transformers' `model.layers` of a causal LM)."""
        base = getattr(self.model, "model", None)
        layers = getattr(base, "layers", None) if base is not None else None
        if not isinstance(layers, torch.nn.ModuleList):
            raise ValueError(f"{self.name}: its decoder layers are not found at `model.layers`")
        return layers

    @contextlib.contextmanager
    def hidden_features(self, layers: tuple[int, ...]):
        """Within it, each forward (on this thread) appends to the list it yields the input of each decoder layer in
        `layers` ([B, width, hidden]; `models.features`). Hooks on those layers, made once: outside it they return
        at once."""
        count = len(self.decoder_layers())
        if any(not 0 <= i < count for i in layers):
            raise ValueError(f"{self.name} has {count} decoder layers: no layer {max(layers)} to read")
        if not hasattr(self, "_hooked"):
            self._capture = threading.local()
            self._hooked: set[int] = set()
        for i in layers:
            if i not in self._hooked:
                self.decoder_layers()[i].register_forward_pre_hook(self._layer_input(i), with_kwargs=True)
                self._hooked.add(i)
        seen: dict[int, torch.Tensor] = {}
        self._capture.seen, self._capture.layers = seen, tuple(layers)
        out: list[torch.Tensor] = []
        try:
            yield out
        finally:
            self._capture.seen = self._capture.layers = None
            out.extend(seen[i] for i in layers if i in seen)

    def capturing(self) -> tuple[int, ...] | None:
        """The layers whose inputs this thread's forwards keep now (`hidden_features`), else None."""
        capture = getattr(self, "_capture", None)
        if capture is None or getattr(capture, "seen", None) is None:
            return None
        return capture.layers

    @contextlib.contextmanager
    def capture_into(self, seen: dict | None):
        """The hidden states of this thread's forwards within go to `seen` (None: nowhere): a compiled step's
        one-time work (races, checks) keeps its own forwards' states out of the caller's, and a feed run in parts
        gathers each part's."""
        capture = getattr(self, "_capture", None)
        if capture is None:
            yield
            return
        before = getattr(capture, "seen", None)
        capture.seen = seen
        try:
            yield
        finally:
            capture.seen = before

    def keep_features(self, layers: tuple[int, ...], features: torch.Tensor) -> None:
        """Hand a compiled step's hidden states ([B, width, len(layers) x hidden], the layers' inputs side by side)
        to the forward's caller, as the hooks of an eager step do."""
        for i, part in zip(layers, features.split(features.shape[-1] // len(layers), -1), strict=True):
            self._capture.seen[i] = part

    def _layer_input(self, index: int):
        def hook(module, args, kwargs):
            seen = getattr(self._capture, "seen", None)
            if seen is not None:
                seen[index] = args[0] if args else kwargs["hidden_states"]

        return hook

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
                attention_mask=causal,
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

    def new_cache(self) -> Any:
        if not self.static:
            return self.dynamic.new_cache()
        cache = static.StaticKV(self.kv_shapes, self.dtype, self.device, storage=self.kv_storage())
        # a cache made for eager steps stays eager: a model may turn compiled meanwhile (`background.switch_ready`)
        cache.compiled = cache.compiled and self.compile
        return cache

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
            and self.steps.kernel == INVARIANT
            and self.steps._invariant_kind == INVARIANT_DPBF16
            and not softcap
            and all(dpbf16.attends(k[3], v[3]) for k, v, _ in self.kv_shapes)
        ):
            return torch.bfloat16
        return torch.float32

    def prepare(self) -> None:
        """Decide the compiled steps' kernels now (a target's runner, before it makes its cache): the cache's
        storage follows them (`kv_storage`). Deciding runs once per machine and is kept."""
        if self.compile and self.static and self.device.type == "cpu":
            if self.steps.resolve_kernel() == INVARIANT:
                self.steps.invariant_kind()

    def crop(self, cache, length: int) -> None:
        if not self.static:
            return self.dynamic.crop(cache, length)
        cache.crop(length)

    def select_rows(self, cache, rows: torch.Tensor) -> None:
        if not self.static:
            return self.dynamic.select_rows(cache, rows)
        cache.select_rows(rows)

    def keep_positions(self, cache, positions: torch.Tensor) -> None:
        if not self.static:
            return self.dynamic.keep_positions(cache, positions)
        cache.keep(positions)

    @property
    def padded_tokens(self) -> int:
        """A compiled step pads up to this many new tokens to a power of two (what its cost curve steps by)."""
        return COMPILED_TOKENS if self.compile or self.graphs else 0

    @torch.inference_mode()
    def forward(self, cache, tokens, positions=None, mask=None, logits_to_keep=0, fused_prefix=0, batch_invariant=True):
        if not self.static:
            return self.dynamic.forward(cache, tokens, positions, mask, logits_to_keep)
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
            and self.steps.kernel == INVARIANT
            and 0 < fused_prefix < n - 1
            and n - fused_prefix - 1 <= COMPILED_TOKENS
        ):
            return self._prompt_then_steps(
                cache, tokens, positions, mask, logits_to_keep, fused_prefix, batch_invariant
            )
        # a prompt (the first feed) runs eagerly: its length differs from call to call. Hidden states kept for a
        # feature-level draft come out of packaged steps (their graph returns them); elsewhere the step runs eagerly
        capturing = self.capturing()
        compiled = self.compile and cache.compiled and past > 0 and n <= COMPILED_TOKENS
        compiled = compiled and (capturing is None or self.steps.packaging())
        if compiled and batch_invariant:  # (a draft's forwards are not: its logits decide nothing)
            with self.capture_into(None):
                self.steps.resolve_kernel()
        graphed = self.graphs and cache.captured and past > 0 and n <= COMPILED_TOKENS
        # new entries written: n real, then padding (a bucket for a compiled or captured step; eagerly in a
        # reduced precision, enough rows that every product takes the kernel it takes for many: batch invariance)
        invariant = compiled and self.steps.kernel == INVARIANT
        if compiled:
            width = bucket(max(n, -(-self.steps.invariant_padding() // b)) if invariant else n)
            if b == 1:
                width = self.bucket_route.get(width, width)
        else:
            width = max(n, -(-self.min_rows // b)) if batch_invariant else n
            if graphed:
                width = bucket(width)
        # a compiled graph is specialised on whether the values it reads (whole key blocks) fill the buffer: a
        # buffer always a block longer keeps one graph per bucket as the cache grows
        cache.reserve(static.whole_blocks(past + width) + 1 if compiled else past + width)
        # a captured step reads every slot of the buffers, so that its shapes stay the same as the cache fills:
        # its mask spans the capacity, and the slots past the new entries are masked (they weigh exactly 0)
        span = cache.capacity if graphed else past + width
        inputs = step_inputs(
            cache, tokens, positions, mask, width, span, self.sliding_window, self.mixed_layers, copy=compiled
        )
        again = (cache, tokens, positions, mask, logits_to_keep)  # a failed compiled or captured step runs again
        if graphed:
            return self._forward_graphed(cache, inputs, logits_to_keep, again, batch_invariant)
        if compiled:
            return self._forward_compiled(cache, inputs, logits_to_keep, again, batch_invariant, invariant)
        return self._forward_eager(cache, inputs, logits_to_keep, fused_prefix, batch_invariant)

    def _forward_eager(self, cache, inputs: StepInputs, logits_to_keep, fused_prefix, batch_invariant):
        n, past = inputs.n, inputs.past
        keep = min(n, logits_to_keep or n)
        # a prompt's start attends through torch's fused attention (one pass where the batch-invariant attention
        # makes a dozen per block of queries): its tokens' logits are not kept, and every method feeds the prompt
        # alike; the tokens after it are attended as in a step
        fused = fused_prefix if past == 0 and not self.sliding_window and keep <= n - fused_prefix else 0
        # in a reduced precision on a CPU, where the rest of the step is batch-invariant, each query's last few
        # values are summed so that a tree's layout does not change them (`static.splits`)
        reduced = self.dtype in (torch.bfloat16, torch.float16)
        cpu = self.device.type == "cpu"
        kernel = self.kernel_attention()
        split = None
        if batch_invariant and reduced and cpu and not kernel:
            split = static.splits(inputs.positions[:, fused:])
        with self._eager_kernels():
            logits = self.step(
                inputs.ids,
                inputs.positions,
                inputs.masks,
                inputs.slots,
                cache.keys,
                cache.values,
                keep + inputs.width - n,
                fused,
                split,
                kernel=kernel,
            )
        cache.length = past + n
        if logits.shape[0] != inputs.ids.shape[0]:  # a step that drops rows would decode the others' tokens
            raise RuntimeError(f"the eager step returned {logits.shape[0]} rows for {inputs.ids.shape[0]} fed")
        return logits[:, :keep, : self.vocab_size].float()  # the padding rows come last

    def _forward_graphed(self, cache, inputs: StepInputs, logits_to_keep, again, batch_invariant):
        try:
            logits = self.graphed.run(inputs.ids, inputs.positions, inputs.masks, inputs.slots, cache)
        except Exception as e:  # noqa: BLE001 - a step that cannot be captured still decodes, uncaptured
            # for this cache only: the next generation tries its graphs again
            cache.captured = False
            self._fall_back(
                f"this generation runs without CUDA graphs: a capture failed ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:200]})"
            )
            return self.forward(*again, batch_invariant=batch_invariant)
        # the graph's output is overwritten by its next replay: the caller gets its own copy
        return self._kept(cache, inputs, logits, logits_to_keep).to(torch.float32, copy=True)

    def _forward_compiled(self, cache, inputs: StepInputs, logits_to_keep, again, batch_invariant, invariant):
        if self.device.type == "cpu" and self.steps.kernel not in ("auto", INVARIANT, *VARIANTS):
            raise ValueError(f"kernel {self.steps.kernel!r}: 'auto', {INVARIANT!r} or one of {', '.join(VARIANTS)}")
        if self.steps.packaging():
            packaged.limit_bytes()  # a bad MULTISPEC_COMPILED_LIMIT_GB is refused, not taken for a failed compile
        try:
            logits = self.steps.run(inputs.ids, inputs.positions, inputs.masks, inputs.slots, cache)
        except Exception as e:  # noqa: BLE001 - a model torch cannot compile still decodes, eagerly
            # nothing is committed before the compiled call returns (the length is set after it), so the same feed
            # runs again from the top: batch-invariant on oneDNN where our kernel's step failed, else eagerly; for
            # this cache only (one generation): the model stays as it was, so a failure in one request changes
            # neither the speed nor the tokens of the next
            why = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
            if invariant and (cache.invariant_kind or self.steps._invariant_kind) == INVARIANT_DPBF16:
                cache.invariant_kind = INVARIANT
                self._fall_back(
                    f"this generation's batch-invariant steps run on oneDNN: on our kernel a step failed ({why})"
                )
            else:
                cache.compiled = False
                self._fall_back(f"this generation runs uncompiled: a compiled step failed ({why})")
            return self.forward(*again, batch_invariant=batch_invariant)
        if invariant and inputs.ids.shape[0] == 1 and inputs.width not in self.steps.invariance:
            logits = logits.clone()  # the probe runs steps of its own before this feed returns
            with self.capture_into(None):
                self.steps.check_invariance(inputs.width)
        return self._kept(cache, inputs, logits, logits_to_keep).float()

    def _kept(self, cache, inputs: StepInputs, logits, logits_to_keep):
        """Commit a padded step's n new entries (its length) and return the logits kept of its n real tokens."""
        cache.length = inputs.past + inputs.n
        logits = logits[:, : inputs.n]
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return logits[..., : self.vocab_size]

    def new_batch_cache(self, rows: int, capacity: int) -> static.StaticKV:
        """A static cache of `rows` rows of `capacity` entries each, for sequences decoded together (`forward_rows`;
        `static.RowKV` is one row of it)."""
        if not self.static:
            raise ValueError(f"{self.name} keeps transformers' dynamic cache: it cannot decode sequences in a batch")
        cache = static.StaticKV(self.kv_shapes, self.dtype, self.device, storage=torch.float32)
        cache.reserve(capacity, rows=rows)
        return cache

    @property
    def batch_rows(self) -> int:
        """Tokens (of all rows) a step over a batch is padded to: `invariant_rows`, in every dtype, so
        that a sequence's logits do not depend on which others were decoded with it. One exception, where single
        steps are not padded either (`min_rows` 1: float32): a step of one token of one row runs unpadded, as
        `generate` runs it, so that a lone request is not charged for the batch it is not in."""
        if self._batch_rows is None:
            with self._row_kernels():
                self._batch_rows = invariant_rows(self.model)
        return self._batch_rows

    def batch_entries(self, tokens: int) -> int:
        """The tokens a batched step computes for `tokens` new ones in all (padded as `batch_rows` says)."""
        if tokens > 1 or self.min_rows > 1:
            return max(tokens, self.batch_rows)
        return tokens

    @torch.inference_mode()
    def forward_rows(self, cache: static.StaticKV, feeds: list[tuple]) -> list[torch.Tensor]:
        """One eager forward over rows of a batch cache (`new_batch_cache`), each row a sequence of its own length,
        their new tokens packed into one sequence (`inputs.packed_inputs`): the linear maps compute the tokens fed
        and no more (padded to `batch_rows` in all), and each row attends over its own cache row only.

        Args:
            cache: the batch cache.
            feeds: at most one per row: (row, a `static.RowKV` of that row, tokens [n], positions [n] or None,
                bool mask [n, held + n] or None: causal, logits to keep: k > 0 the last k, 0 all[, fused: a
                prompt's first tokens, fed into an empty row, attended by torch's fused kernel as `forward`'s
                `fused_prefix`]).

        Returns:
            The kept logits [k, vocab] of each feed, in order. Each row's held length advances by its n.
        """
        if len({f[0] for f in feeds}) != len(feeds):
            raise ValueError("one feed per row in a step")
        rows = 1 + max(f[0] for f in feeds)
        lengths = torch.zeros(rows, dtype=torch.long)
        for row in range(rows):  # a row not fed keeps its held entries (those past them are free)
            view = getattr(cache, "views", {}).get(row)
            lengths[row] = view.length if view is not None else 0
        given, kept = [], []
        for row, kv, tokens, positions, mask, keep, *fused in feeds:
            tokens = tokens.reshape(-1).cpu()
            n = tokens.numel()
            if kv.length + n > kv.capacity:
                raise ValueError(
                    f"a sequence in this batch holds at most {kv.capacity} entries, {kv.length + n} asked for"
                )
            positions = torch.arange(kv.length, kv.length + n) if positions is None else positions.reshape(-1).cpu()
            lengths[row] = kv.length
            mask = None if mask is None else mask.reshape(n, -1).cpu()
            given.append((row, kv.length, tokens, positions, mask, fused[0] if fused else 0))
            kept.append(min(n, keep or n))
        step = packed_inputs(
            given,
            lengths,
            self.batch_entries(sum(len(g[2]) for g in given)),
            NARROW_TOKENS,
            cache.positions[:rows],
            self.sliding_window,
            self.mixed_layers,
        )
        if int(step.token_slots.max()) >= cache.capacity:
            raise ValueError(f"a sequence in this batch would hold more than {cache.capacity} entries")
        # the logits of the tokens kept only (a prompt's chunk keeps none, or its last), at least `batch_rows`
        # of them: the output head is a linear map like the others
        index = torch.cat(
            [torch.arange(s + len(g[2]) - k, s + len(g[2])) for s, g, k in zip(step.starts, given, kept, strict=True)]
        )
        fewest = self.batch_entries(index.numel())
        if index.numel() < fewest:
            index = torch.cat([index, index[-1:].expand(fewest - index.numel())])
        with self._row_kernels():
            logits = self.step(
                step.ids,
                step.positions,
                self._packed_masks(),
                step.token_slots,
                [k[:rows] for k in cache.keys],
                [v[:rows] for v in cache.values],
                index.to(self.device),
                packed=step,
                kernel=self.kernel_attention(),
            )[0]
        out, at = [], 0
        for (_, kv, *_), (_, _, tokens, *_), k in zip(feeds, given, kept, strict=True):
            kv.length += tokens.numel()
            out.append(logits[at : at + k, : self.vocab_size].float())
            at += k
        return out

    def _packed_masks(self):
        """What a packed step passes as its attention mask: a marker of each layer's kind only (the masks are
        the groups', `static.attend_packed`), shaped [1, 1, 1, 1] for full attention and [1, 1, 1, 2] for a
        sliding window."""
        full, sliding = torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 2)
        if not self.sliding_window:
            return full
        return {"full_attention": full, "sliding_attention": sliding} if self.mixed_layers else sliding

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
        outer = self._capture.seen if self.capturing() is not None else None  # the caller keeps hidden states
        parts: tuple[dict, dict] = ({}, {})
        with self.capture_into(parts[0] if outer is not None else None):
            head = self.forward(
                cache,
                tokens[:, :p],
                None if positions is None else positions[:, :p],
                None if mask is None else mask[:, :p, :p],
                max(before, 1),
                fused_prefix,
                batch_invariant,
            )
        with self.capture_into(parts[1] if outer is not None else None):
            tail = self.forward(
                cache,
                tokens[:, p:],
                None if positions is None else positions[:, p:],
                None if mask is None else mask[:, p:, :n],
                after,
                0,
                batch_invariant,
            )
        if outer is not None:  # the prompt's states (its padding dropped), then the rest's
            outer.update({i: torch.cat([parts[0][i][:, :p], parts[1][i]], 1) for i in parts[0]})
        return torch.cat([head[:, head.shape[1] - before :], tail], 1)

    def step(
        self,
        ids,
        positions,
        masks,
        slots,
        keys,
        values,
        logits_to_keep=0,
        fused=0,
        split=None,
        exact=False,
        packed=None,
        kernel=False,
    ):
        if kernel and not torch.compiler.is_compiling():
            lean = self.lean()
            if lean is not None and lean.usable():
                return lean.step(ids, positions, masks, slots, keys, values, logits_to_keep, fused, packed)
        extra = {"ms_fused": fused} if fused else {}
        if kernel:
            extra["ms_kernel"] = True
        if packed is not None:
            extra["ms_packed"] = packed
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

    def _fall_back(self, why: str) -> None:
        self.fallbacks.append(why)
        note(f"multispec: {self.name}: {why}")

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
