"""What a forward costs on the machine that runs it: T(k, c), the seconds of one forward over k new tokens on a
cache of c cached tokens.

`forward_cost(model)` measures it once per model, dtype, device, engine and thread count (two context lengths,
interpolated; a few seconds), keeps it in memory and, for Hugging Face models, in the cache folder. The draft
length controller (`multispec.drafting.length`) and the tuning tools read it.
"""

from __future__ import annotations

import bisect
import functools
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import machine
from ..machine import describe_device, instruction_sets, read_store, store_path, write_store_entry
from . import linears
from .base import LanguageModel
from .static import STEP_VERSION, bucket

# the most drafts `gamma=auto` proposes
MAX_AUTO_GAMMA = 10
COST_CONTEXTS = (128, 1024)  # cached tokens while measuring: attention makes long contexts dearer
# new-token counts measured: every chain `gamma=auto` may verify, then sparser up to a 64-node tree plus its root
COST_TOKENS = (*range(1, MAX_AUTO_GAMMA + 3), 16, 24, 32, 48, 65)


@dataclass(frozen=True)
class ForwardCost:
    """seconds[c][j]: one forward over tokens[j] new tokens after contexts[c] cached ones (tokens default
    1, 2, ...). Between measured token counts and contexts the cost is interpolated linearly; beyond the
    contexts it is extrapolated along the last segment (never below the shortest context's cost), beyond the
    largest token count along the last step.

    `padded`: the model pads a forward of up to that many new tokens to the next power of two (a compiled
    step: one graph per bucket), so its cost is a staircase: k costs what a measured count of k's bucket
    cost (17 tokens cost 32's), not an interpolation across the step."""

    seconds: tuple[tuple[float, ...], ...]
    contexts: tuple[int, ...] = (COST_CONTEXTS[0],)
    tokens: tuple[int, ...] | None = None
    padded: int = 0

    def __post_init__(self):
        if not self.seconds or isinstance(self.seconds[0], (int, float)):  # one context given as a flat tuple
            object.__setattr__(self, "seconds", (tuple(self.seconds),))
        if len(self.contexts) != len(self.seconds):
            raise ValueError("one row of seconds per context")
        if self.tokens is None:
            object.__setattr__(self, "tokens", tuple(range(1, len(self.seconds[0]) + 1)))
        if any(len(row) != len(self.tokens) for row in self.seconds):
            raise ValueError("one cost per measured token count")

    def scaled(self, factor: float) -> ForwardCost:
        """The same curve times `factor` (a calibration against measured runs)."""
        return ForwardCost(
            tuple(tuple(x * factor for x in row) for row in self.seconds), self.contexts, self.tokens, self.padded
        )

    def __call__(self, k: int, context: int | None = None) -> float:
        if k <= 0:
            return 0.0
        return float(self._between_contexts(_point_rows(self, k), context))

    def curve(self, most: int, context: int | None = None) -> np.ndarray:
        """[T(k, context) for k in 0..most] in one call (a tree search reads every size)."""
        return self._between_contexts(_curve_rows(self, most), context)

    def _at_contexts(self, k: int) -> list[float]:
        """T(k) at each measured context."""
        if k <= self.padded:
            # the largest measured count in k's bucket (padding makes them cost the same)
            same = [t for t in self.tokens if t <= self.padded and bucket(t) == bucket(k)]
            k = max(same) if same else k
        return [_extend(self.tokens, row, k) for row in self.seconds]

    def _between_contexts(self, rows: np.ndarray, context: int | None) -> np.ndarray:
        """Interpolate per-context costs `rows` [contexts, ...] at `context`."""
        if context is None or len(rows) == 1:
            return rows[0]
        c = self.contexts
        i = max(0, min(len(c) - 2, sum(context > x for x in c[1:-1])))
        w = (context - c[i]) / (c[i + 1] - c[i])
        return np.maximum(rows[0], rows[i] + w * (rows[i + 1] - rows[i]))


@functools.lru_cache(maxsize=1024)
def _point_rows(cost: ForwardCost, k: int) -> np.ndarray:
    """[contexts]: T(k) at each measured context (read many times per decoding iteration)."""
    rows = np.array(cost._at_contexts(k))
    rows.setflags(write=False)
    return rows


@functools.lru_cache(maxsize=64)
def _curve_rows(cost: ForwardCost, most: int) -> np.ndarray:
    """[contexts, most + 1]: T(k) at each measured context for k = 0..most (0 costs nothing)."""
    rows = np.zeros((len(cost.seconds), most + 1))
    for k in range(1, most + 1):
        rows[:, k] = cost._at_contexts(k)
    rows.setflags(write=False)
    return rows


def _extend(tokens: tuple[int, ...], row: tuple[float, ...], k: int) -> float:
    j = bisect.bisect_left(tokens, k)
    if j < len(tokens) and tokens[j] == k:
        return row[j]
    if j == 0:
        return row[0]
    if j < len(tokens):  # between two measured counts
        w = (k - tokens[j - 1]) / (tokens[j] - tokens[j - 1])
        return row[j - 1] + w * (row[j] - row[j - 1])
    if len(row) == 1:
        return row[0] * k / tokens[0]
    slope = max((row[-1] - row[-2]) / (tokens[-1] - tokens[-2]), 0.0)
    return row[-1] + slope * (k - tokens[-1])


ROUTE_MARGIN = 0.05  # a bucket moves to a larger one only when that one ran at least this much faster
_COSTS: dict[str, ForwardCost] = {}
_MEASURED_HERE: set[str] = set()  # keys of the curves measured in this process (not read from the folder)


def cost_key(
    model: LanguageModel,
    masked: bool = False,
    batch_invariant: bool = True,
    kernels: bool = True,
    batched: bool = False,
) -> str:
    """The key of a model's measured costs on this machine. `kernels=False`: without the compiled step's kernel
    set, for the kernel choices themselves (kept per shape when a variant joins, see `CompiledSteps._untried`).
    `batched`: of its batched steps (`forward_rows`), which run eagerly whether or not the model is compiled."""
    dtype = getattr(model, "dtype", None)
    engine = (
        "compiled" if getattr(model, "compile", False) else "static" if getattr(model, "static", False) else "eager"
    )
    if batched:
        engine = "static"
    packed = getattr(model, "rows_packed" if batched else "eager_packed", lambda: False)
    if engine == "static" and packed():
        engine = "static+packed"  # linear maps on packed weights (`multispec.models.linears`): another curve
        inner = getattr(model, "model", None)
        kinds = {linears.packed_kind(m) for m in inner.modules()} if inner is not None else set()
        ours = linears.TILES if linears.TILES in kinds else linears.DPBF16 if linears.DPBF16 in kinds else None
        if ours is not None:
            engine = "static+tiles" if ours == linears.TILES else "static+dpbf16"  # ... on our kernel
            lean = getattr(model, "lean", lambda: None)
            if lean() is not None:  # ... and a Llama's layers one kernel call each (`hf/lean.py`)
                from . import dpbf16

                engine = f"static+lean{'' if ours == linears.TILES else '+dpbf16'}|dpbf16={dpbf16._digest()}"
    steps = getattr(model, "steps", None)  # a compiled model's steps (`HFModel.steps`), settled by `prepare`
    if engine == "compiled" and getattr(steps, "kernel", None) == "invariant":
        engine = "compiled+invariant"  # the batch-invariant compiled step (`HFModel`, compile="invariant")
    # eager static forwards pay for batch invariance (a draft's do not); in a reduced precision on a CPU, with
    # the float64 tail of each query's attention (`static.splits`), which curves measured before it lack
    variant = ""
    if engine.startswith("compiled"):
        # another compiled graph for the same model: its packages and curves are made again
        variant = f"|step={STEP_VERSION}"
        if kernels and steps is not None and steps.offers("dpbf16") is None:
            # our kernel joins the race here (or runs the batch-invariant step): steps, and so the curve, change
            # (and again with each build of it, which may run faster)
            from . import dpbf16

            variant += f"|dpbf16={dpbf16._digest()}"
    if engine.startswith("static"):
        from . import static

        if not batch_invariant:
            variant = "|not-invariant"
        elif dtype in (torch.bfloat16, torch.float16) and torch.device(model.device).type == "cpu":
            variant = f"|tail={static.TAIL}"
    return (
        f"{model.name}|{dtype}|{model.device}|{engine}|threads={torch.get_num_threads()}|"
        f"torch={torch.__version__}|isa={instruction_sets()}" + variant + ("|masked" if masked else "")
    )


def forward_cost(
    model: LanguageModel,
    tokens: tuple[int, ...] = COST_TOKENS,
    masked: bool = False,
    here: bool = False,
    batch_invariant: bool = True,
) -> ForwardCost:
    """T(k) for k in `tokens` (interpolated between) for `model`, measured once (see the module note).
    `masked`: the forward given an explicit attention mask, as a tree's is (it may take a slower attention
    path than the causal one). `here`: measured in this process, not read from the cache folder (a compiled
    model's kernels are autotuned per process, and its bucket route comes from this measurement).
    `batch_invariant`: as the forwards it prices are called (False for a draft's: `LanguageModel.forward`).
    A stand-in for a model (a batch row's, `multispec.batching.RowModel`) has it measured on the model itself,
    where the stand-in says (`measure_alone`: between the batch's forwards, on fresh caches)."""
    measure_alone = getattr(model, "measure_alone", None)
    if measure_alone is not None:
        return measure_alone(lambda m: forward_cost(m, tokens, masked, here, batch_invariant))
    if batch_invariant:
        model.prepare()  # a target's kernels (compile=True may run batch-invariant steps: decided once per machine)
    key = cost_key(model, masked, batch_invariant)
    if key in _COSTS and (not here or key in _MEASURED_HERE):
        return _COSTS[key]
    store = store_path() if _persistent(model) else None
    if store is not None and not here:
        saved = read_store(store).get(key)
        if (
            isinstance(saved, dict)
            and saved.get("contexts") == list(COST_CONTEXTS)
            and saved.get("tokens") == list(tokens)
        ):
            _COSTS[key] = ForwardCost(
                tuple(map(tuple, saved["seconds"])), tuple(saved["contexts"]), tokens, padded_tokens(model)
            )
            route = getattr(model, "bucket_route", None)
            if saved.get("route") and route is not None and not route and not masked:
                # the buckets this machine's measuring process moved (its autotuned graph for them ran slower);
                # the curve read here was priced with them moved
                route.update({int(b): int(x) for b, x in saved["route"].items()})
            return _COSTS[key]
    compiled_before, t0 = getattr(model, "compile_seconds", 0.0), time.perf_counter()
    cost = measure_forward_cost(model, tokens, masked=masked, batch_invariant=batch_invariant)
    # a one-time cost, like compiling (which the model counts itself)
    machine.calibration_seconds += time.perf_counter() - t0 - (getattr(model, "compile_seconds", 0.0) - compiled_before)
    _COSTS[key] = cost
    _MEASURED_HERE.add(key)
    if store is not None:
        entry = {
            "contexts": list(cost.contexts),
            "tokens": list(cost.tokens),
            "seconds": [list(r) for r in cost.seconds],
        }
        if not masked and getattr(model, "bucket_route", None):
            entry["route"] = {str(b): x for b, x in model.bucket_route.items()}
        write_store_entry(store, key, entry)
    return cost


def measure_forward_cost(
    model: LanguageModel,
    tokens: tuple[int, ...] = COST_TOKENS,
    contexts: tuple[int, ...] = COST_CONTEXTS,
    repeats: int = 4,
    masked: bool = False,
    batch_invariant: bool = True,
) -> ForwardCost:
    """Median over `repeats` interleaved rounds of the seconds of a forward over k new tokens, k in `tokens`,
    after each of `contexts` cached tokens (random token ids: the cost does not depend on which). `masked`:
    each forward gets an explicit (causal) mask, the way a tree's forward does.

    A model that pads forwards to buckets (a compiled one: `padded_tokens`) has each bucket's own graph timed;
    where a larger bucket ran faster (autotuning may pick a slower kernel for a smaller one), an unmasked
    measurement routes the smaller bucket's forwards to it (the model's `bucket_route`), and the curve says what the
    routed forwards cost."""
    if batch_invariant:
        model.prepare()  # a target's kernels, and so its cache's storage, as a target's runner decides them
    padded = padded_tokens(model)
    route = getattr(model, "bucket_route", None)
    if padded and route is not None:
        saved_route = dict(route)
        route.clear()  # time every bucket's own graph
    if model.max_length is not None:  # toy models' short horizons (the last position is never fed)
        contexts = tuple(sorted({max(1, min(c, (model.max_length - 1) // 2)) for c in contexts}))
        room = max(1, model.max_length - 1 - contexts[-1])
        tokens = tuple(k for k in tokens if k <= room) or (1,)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(model.vocab_size, (1, contexts[-1] + tokens[-1]), generator=gen).to(model.device)
    rows = []
    for context in contexts:
        cache = model.new_cache()
        model.forward(cache, ids[:, :context], logits_to_keep=1, batch_invariant=batch_invariant)
        masks = {
            k: torch.ones(k, context + k, dtype=torch.bool).tril(context)[None].to(model.device) if masked else None
            for k in tokens
        }
        for k in tokens:  # warm-up: lazy initialisation, allocator, a compile per bucket
            model.forward(
                cache, ids[:, context : context + k], mask=masks[k], logits_to_keep=k, batch_invariant=batch_invariant
            )
            model.crop(cache, context)
        times: list[list[float]] = [[] for _ in tokens]
        for _ in range(repeats):
            for j, k in enumerate(tokens):
                _sync(model)
                t0 = time.perf_counter()
                model.forward(
                    cache,
                    ids[:, context : context + k],
                    mask=masks[k],
                    logits_to_keep=k,
                    batch_invariant=batch_invariant,
                )
                _sync(model)
                times[j].append(time.perf_counter() - t0)
                model.crop(cache, context)
        rows.append([statistics.median(t) for t in times])
    if padded:
        if route is not None:
            route.update(saved_route if masked else bucket_route(rows, tokens, padded))
        rows = [_routed(row, tokens, padded, route or {}) for row in rows]
    # a longer forward never costs less; a noisy dip would make the controller prefer it
    rows = [tuple(max(row[: j + 1]) for j in range(len(row))) for row in rows]
    return ForwardCost(tuple(rows), contexts, tokens, padded)


# a batched step's shapes measured (rows, new entries per row) and the entries each row holds meanwhile: the
# entries in all (rows x width, 1 .. 64) set what its linear maps cost, and they dominate it
BATCH_SHAPES = ((1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (8, 8))
BATCH_CONTEXT = 256


@torch.inference_mode()
def batch_forward_cost(model, batch_invariant: bool = True) -> ForwardCost:
    """T(n) of a batched step (`HFModel.forward_rows`: rows of their own, padded as a batch pads them) over n
    new entries in all, for n in 1, 2, 4, ... 64 (`BATCH_SHAPES`), each row holding `BATCH_CONTEXT` entries;
    measured once per model and machine (about ten forwards per shape, seconds), kept like `forward_cost`.
    A batch's step costs more than one sequence's forward over as many tokens (another layout of the same
    products, a mask per row), so the batch's draft length is priced from this curve, not from T(k, c)."""
    key = cost_key(model, batch_invariant=batch_invariant, batched=True) + "|batch"
    tokens = tuple(rows * width for rows, width in BATCH_SHAPES)
    if key in _COSTS:
        return _COSTS[key]
    store = store_path() if _persistent(model) else None
    saved = read_store(store).get(key) if store is not None else None
    if isinstance(saved, dict) and saved.get("tokens") == list(tokens) and saved.get("contexts") == [BATCH_CONTEXT]:
        _COSTS[key] = ForwardCost(tuple(map(tuple, saved["seconds"])), (BATCH_CONTEXT,), tokens)
        return _COSTS[key]
    from .static import RowKV

    t0 = time.perf_counter()
    most = max(rows for rows, _ in BATCH_SHAPES)
    widest = max(width for _, width in BATCH_SHAPES)
    cache = model.new_batch_cache(most, BATCH_CONTEXT + widest + 64)
    views = [RowKV(cache, row) for row in range(most)]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(model.vocab_size, (1, BATCH_CONTEXT + widest), generator=gen).to(model.device)
    model.forward(views[0], ids[:, :BATCH_CONTEXT], logits_to_keep=1)
    for view in views[1:]:  # the other rows hold the same entries (the cost does not depend on which)
        for buffers in (cache.keys, cache.values):
            for b in buffers:
                b[view.row].copy_(b[0])
        cache.positions[view.row].copy_(cache.positions[0])
        view.length = BATCH_CONTEXT

    def step(rows: int, width: int) -> float:
        feeds = [(row, views[row], ids[0, BATCH_CONTEXT : BATCH_CONTEXT + width], None, None, 1) for row in range(rows)]
        _sync(model)
        start = time.perf_counter()
        model.forward_rows(cache, feeds)
        _sync(model)
        for view in views[:rows]:
            view.length = BATCH_CONTEXT
        return time.perf_counter() - start

    for shape in BATCH_SHAPES:  # warm-up
        step(*shape)
    times: list[list[float]] = [[] for _ in BATCH_SHAPES]
    for _ in range(3):
        for j, shape in enumerate(BATCH_SHAPES):
            times[j].append(step(*shape))
    row = [statistics.median(t) for t in times]
    row = tuple(max(row[: j + 1]) for j in range(len(row)))  # more entries never cost less
    cost = ForwardCost((row,), (BATCH_CONTEXT,), tokens)
    machine.calibration_seconds += time.perf_counter() - t0
    _COSTS[key] = cost
    if store is not None:
        write_store_entry(store, key, {"contexts": [BATCH_CONTEXT], "tokens": list(tokens), "seconds": [list(row)]})
    return cost


def bucket_route(rows: list[list[float]], tokens: tuple[int, ...], padded: int) -> dict[int, int]:
    """For each bucket of padded forwards, the bucket at least as large whose forward cost least (seconds
    averaged over the counts measured in a bucket, which all ran its graph, and over the contexts); only
    buckets that move are listed."""
    mean = _bucket_means(rows, tokens, padded)
    route = {b: min((x for x in mean if x >= b), key=lambda x: (mean[x], x)) for b in mean}
    # a move pays for more padding work outside the graph: only for a clear gain, not for timing noise
    return {b: x for b, x in route.items() if x != b and mean[x] < (1 - ROUTE_MARGIN) * mean[b]}


def _routed(row: list[float], tokens: tuple[int, ...], padded: int, route: dict[int, int]) -> list[float]:
    """A measured row as the routed forwards cost: each padded count costs the mean over the counts measured in
    the bucket it runs in (they all ran that graph), past the padded range as measured."""
    mean = _bucket_means([row], tokens, padded)
    return [
        mean[route.get(bucket(t), bucket(t))] if t <= padded else seconds
        for t, seconds in zip(tokens, row, strict=True)
    ]


def _bucket_means(rows, tokens: tuple[int, ...], padded: int) -> dict[int, float]:
    """Mean seconds per bucket over the padded counts measured in it (they all ran its graph), over `rows`."""
    by_bucket: dict[int, list[float]] = {}
    for row in rows:
        for t, seconds in zip(tokens, row, strict=True):
            if t <= padded:
                by_bucket.setdefault(bucket(t), []).append(seconds)
    return {b: statistics.fmean(v) for b, v in by_bucket.items()}


def padded_tokens(model: LanguageModel) -> int:
    """Up to how many new tokens the model pads a forward to a power of two (0: it does not)."""
    return int(getattr(model, "padded_tokens", 0) or 0)


def _persistent(model: LanguageModel) -> bool:
    return bool(getattr(model, "keeps_measurements", False))


def _sync(model: LanguageModel) -> None:
    if getattr(model.device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(model.device)


# -- a device's curves in a file (`multispec cost-curve --out`) ---------------------------------------

CURVE_FORMAT = "multispec-cost-curve/1"


def write_cost_curves(path, models: dict[str, LanguageModel], repeats: int = 4) -> dict:
    """Measure T(k, c) afresh for each model ({"target": ..., "draft": ...}) and write them, with the device,
    date and host, as one JSON file; return what was written."""
    import platform

    curves = {}
    for role, model in models.items():
        if model is None:
            continue
        cost = measure_forward_cost(model, repeats=repeats, batch_invariant=role != "draft")
        curves[role] = {
            "name": model.name,
            "dtype": str(getattr(model, "dtype", "")).replace("torch.", ""),
            "engine": cost_key(model, batch_invariant=role != "draft").split("|")[3],
            "padded_tokens": cost.padded,
            "contexts": list(cost.contexts),
            "tokens": list(cost.tokens),
            "seconds": [list(r) for r in cost.seconds],
        }
    some = next(m for m in models.values() if m is not None)
    data = {
        "format": CURVE_FORMAT,
        "date": time.strftime("%Y-%m-%d"),
        "host": platform.node(),
        "device": describe_device(some.device),
        "torch": torch.__version__,
        "models": curves,
    }
    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return data


def read_cost_curves(path) -> tuple[dict[str, ForwardCost], dict]:
    """The curves of a file written by `write_cost_curves`: ({role: ForwardCost}, the file's data)."""
    from ..params import read_json

    data = read_json(path, "cost-curve file")
    if not isinstance(data, dict) or data.get("format") != CURVE_FORMAT or not isinstance(data.get("models"), dict):
        raise ValueError(f"{path} is not a cost-curve file of multispec (written by `multispec cost-curve --out`)")
    curves = {}
    for role, c in data["models"].items():
        try:
            curves[role] = ForwardCost(
                tuple(tuple(float(x) for x in row) for row in c["seconds"]),
                tuple(int(x) for x in c["contexts"]),
                tuple(int(x) for x in c["tokens"]),
                int(c.get("padded_tokens", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: the {role!r} curve is malformed ({e})") from None
    return curves, data
