"""A model's compiled steps: which kernel variant each shape runs (raced here, once per machine, and kept), the
batch-invariant step and its checks, and the packages on disk that later processes load.

`CompiledSteps` belongs to one `HFModel` (its `steps`) and calls back into it for the eager step it compiles
(`HFModel.step`) and for the forwards its races and checks time (`HFModel.forward`). The one-time costs it pays
are counted on the model (`compiles`, `compile_seconds`), where every backend reports them."""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import TYPE_CHECKING, Any

import torch

from ...console import note
from ...machine import undisturbed
from .. import dpbf16, packaged, static
from ..static import bucket
from . import store
from .kernels import (
    _COMPILE_ISOLATES,
    CHOICE_ROUNDS,
    CONCAT,
    DPBF16,
    EXACT_CHOICE,
    EXACT_TOLERANCE,
    INVARIANCE_PROMPT,
    INVARIANT,
    INVARIANT_CHOICE,
    INVARIANT_DPBF16,
    RACED,
    VARIANTS,
    compile_settings,
    kernel_options,
    on_dpbf16,
)

if TYPE_CHECKING:
    from .model import HFModel


class CompiledSteps:
    """The compiled steps of one model (`HFModel.steps`; used where `HFModel.compile` is on).

    `kernel`: "auto" (each shape's variant of `VARIANTS` chosen by timing, `kernels`) or INVARIANT (one
    batch-invariant variant for every shape, `invariant_kind`). `run` takes one step's inputs and returns its
    logits [rows, width, vocab] (padded rows and columns included)."""

    def __init__(self, hf: HFModel, kernel: str, exact: bool | None):
        self.hf = hf
        self.kernel = kernel
        self._invariant_kind: str | None = None  # the variant INVARIANT steps run in (`invariant_kind`)
        # compile=True: whether steps are batch-invariant here all the same (`resolve_kernel`; None: not decided)
        self._exact = exact
        # (rows, new tokens) -> the variant of `KERNELS` its compiled step runs (kernel "auto")
        self.kernels: dict[tuple[int, int], str] = {}
        # INVARIANT: a bucket of new tokens (one row) -> how many of its tokens got other logits than one-token
        # steps when checked on this machine (`check_invariance`; 0: the same bits)
        self.invariance: dict[int, int] = {}
        self._compiled: dict[str, Any] = {}  # a compiled step per kernel variant
        self._packages: dict[tuple[str, tuple[int, int]], Any] = {}  # (variant, shape) -> a step loaded from disk
        self._packaged: bool | None = None
        self._routes: bool | None = None  # whether our kernel (`dpbf16`) takes any of the model's linear maps
        self._weights_key: str | None = None
        self._shapes: set[tuple[str, tuple[int, int]]] = set()

    def resolve_kernel(self) -> str:
        """The compiled step's kernel mode ("auto" or INVARIANT), deciding it on first asking: with compile=True,
        where our kernels take every product here, a one-token batch-invariant step on them
        (`INVARIANT_DPBF16`) is timed against the fast one (interleaved, once per machine, kept), and the steps
        are batch-invariant wherever it cost at most EXACT_TOLERANCE times as much: greedy speculative outputs
        then equal greedy `ar`'s in bfloat16 as well."""
        if self._exact is None:
            self._exact = False  # (the race's own steps come back here)
            if self.exact_eligible():
                kept = store.stored_entry(self.package_key(), EXACT_CHOICE)
                exact = kept["exact"] if isinstance((kept or {}).get("exact"), bool) else self._race_exact()
                if exact:
                    self.kernel, self._invariant_kind, self._exact = INVARIANT, INVARIANT_DPBF16, True
        return self.kernel

    def exact_eligible(self) -> bool:
        """Whether compile=True races the batch-invariant step on our kernels against the fast one here."""
        return (
            self.hf.device.type == "cpu"
            and self.hf.dtype == torch.bfloat16
            and self.offers(DPBF16) is None
            and dpbf16.routes_all(self.hf.model)
        )

    @staticmethod
    def stored_name(kind: str, storage: torch.dtype) -> str:
        """The name a variant's package is kept under: one per type of cache buffer it was exported with."""
        return kind if storage == torch.float32 else f"{kind}-kv-{str(storage).removeprefix('torch.')}"

    def _race_exact(self) -> bool:
        key = self.package_key()  # the fast steps' (the choice is kept under it)
        compiled_before, t0 = self.hf.compile_seconds, time.perf_counter()
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
        store.store_entry(
            key, EXACT_CHOICE, {"exact": exact, "step_ms": {k: round(1e3 * v, 3) for k, v in seconds.items()}}
        )
        self.hf.compile_seconds = compiled_before + time.perf_counter() - t0  # a one-time cost
        note(
            f"multispec: {self.hf.name}, 1 token: "
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
        ids = torch.randint(self.hf.vocab_size, (1, INVARIANCE_PROMPT + 1), generator=torch.Generator().manual_seed(0))
        cache = self.hf.new_cache()
        self.hf.forward(cache, ids[:, :-1], logits_to_keep=1)
        past = cache.length
        times: dict[str, list[float]] = {name: [] for name in settings}
        for rounds in (2, CHOICE_ROUNDS):
            for _ in range(rounds):
                for name in list(times):
                    self.kernel, self._invariant_kind = settings[name]
                    start = time.perf_counter()
                    self.hf.forward(cache, ids[:, -1:])
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
            if self.offers(DPBF16) is not None or not dpbf16.routes_all(self.hf.model):
                self._invariant_kind = INVARIANT
            else:
                kept = (store.stored_entry(self.package_key(), INVARIANT_CHOICE) or {}).get("kernel")
                self._invariant_kind = kept if kept in (INVARIANT, INVARIANT_DPBF16) else self._race_invariant()
        return self._invariant_kind

    def _race_invariant(self) -> str:
        """Time a one-token batch-invariant step on oneDNN and on our kernel (`_time_one_token`), keep the faster
        here, and drop the other's package."""
        compiled_before, t0 = self.hf.compile_seconds, time.perf_counter()
        seconds = self._time_one_token({kind: (INVARIANT, kind) for kind in (INVARIANT_DPBF16, INVARIANT)})
        kind = min(seconds, key=seconds.get) if seconds else INVARIANT
        store.store_entry(
            self.package_key(),
            INVARIANT_CHOICE,
            {"kernel": kind, "step_ms": {k: round(1e3 * v, 3) for k, v in seconds.items()}},
        )
        for other, shape in [key for key in self._packages if key[0] != kind]:
            self._packages.pop((other, shape))
            packaged.remove(packaged.path_for(self.package_key(), other, shape))
        self.hf.compile_seconds = compiled_before + time.perf_counter() - t0  # a one-time cost
        note(
            f"multispec: {self.hf.name}'s batch-invariant step, 1 token: "
            + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in seconds.items())
            + f" here; keeps {kind}"
        )
        return kind

    def invariant_padding(self) -> int:
        """Rows a batch-invariant compiled step is padded to."""
        return 1 if self.invariant_kind() == INVARIANT_DPBF16 else self.hf.min_rows

    def check_invariance(self, width: int) -> None:
        """The batch-invariant step for `width` new tokens (one row) against one-token steps, once per bucket on
        this machine (the outcome is kept beside the kernel choices): a chain of `width` tokens after a short
        prompt, scored in one step and one token at a time, must get the same logits bit for bit. Batch
        invariance rests on kernels that do not change with the rows (`INVARIANT_KERNELS`, `min_rows` measured on
        the eager kernels); where this machine's do, a line says so, and `invariance` keeps the count."""
        self.invariance[width] = 0  # the probe's own feeds come back through `forward`
        if width <= bucket(self.invariant_padding()):
            return  # the one-token step's own bucket
        differing = store.stored_check(self.hf, width)
        if differing is None:
            compiled_before, t0 = self.hf.compile_seconds, time.perf_counter()
            differing = self._probe_invariance(width)
            store.store_check(self.hf, width, differing)
            # a one-time cost, kept out of decoding time as compiling is
            self.hf.compile_seconds = compiled_before + time.perf_counter() - t0
        self.invariance[width] = differing
        if differing:
            note(
                f"multispec: {self.hf.name}'s batch-invariant step for {width} new tokens gave {differing} of {width} "
                "tokens other logits than one-token steps on this machine: its kernels change with the rows "
                "here, and greedy speculative outputs may differ from greedy ar's"
            )

    def _probe_invariance(self, width: int) -> int:
        """Of a chain of `width` random tokens after a short prompt, how many get other logits scored in one
        forward than one token at a time (bit for bit)."""
        ids = torch.randint(
            self.hf.vocab_size, (1, INVARIANCE_PROMPT + width), generator=torch.Generator().manual_seed(0)
        )
        prompt, chain = ids[:, :INVARIANCE_PROMPT], ids[:, INVARIANCE_PROMPT:]
        cache = self.hf.new_cache()
        self.hf.forward(cache, prompt, logits_to_keep=1)
        whole = self.hf.forward(cache, chain)[0]
        cache = self.hf.new_cache()
        self.hf.forward(cache, prompt, logits_to_keep=1)
        steps = torch.cat([self.hf.forward(cache, chain[:, i : i + 1])[0] for i in range(width)])
        return int((whole != steps).any(-1).sum())

    def _invariant_step(self, ids, positions, masks, slots, keys, values):
        # with splits, attention runs through the batch-invariant operator (`static.attention`); they are a
        # function of the positions, computed in the graph, so the step takes the plain step's arguments
        return self.hf.step(ids, positions, masks, slots, keys, values, 0, 0, static.splits(positions))

    def _exact_step(self, ids, positions, masks, slots, keys, values):
        # on our kernels, attention runs through our invariant operator where it takes the heads (`dpbf16.attend`;
        # `static.attention` falls back to the split one elsewhere)
        return self.hf.step(ids, positions, masks, slots, keys, values, 0, 0, static.splits(positions), exact=True)

    def _step_for(self, kind: str):
        """The function a kernel variant's compiled step runs."""
        if kind == INVARIANT_DPBF16:
            return self._exact_step
        return self._invariant_step if kind == INVARIANT else self.hf.step

    def _with_features(self, step, layers: tuple[int, ...]):
        """`step`, returning the inputs of decoder layers `layers` beside its logits (side by side: [rows, width,
        len(layers) x hidden]), caught by the model's hooks as it is traced (`HFModel.hidden_features`)."""

        def run(ids, positions, masks, slots, keys, values):
            seen: dict[int, torch.Tensor] = {}
            with self.hf.capture_into(seen):
                logits = step(ids, positions, masks, slots, keys, values)
            return logits, torch.cat([seen[i] for i in layers], -1)

        return run

    def run(self, ids, positions, masks, slots, cache):
        """The step's logits [rows, width, vocab]. Where the caller keeps hidden states (`HFModel.capturing`), the
        step is a package that returns them too (one per variant, shape and set of layers), and they are handed
        over (`HFModel.keep_features`)."""
        args = (ids, positions, masks, slots, cache.keys, cache.values)
        shape = (ids.shape[0], ids.shape[1])
        layers = self.hf.capturing()
        with self.hf.capture_into(None):  # the one-time races' and checks' own forwards keep nothing
            kind, stored = self._kind(shape, cache)
            if kind is None:
                # first use of this shape on this machine (or its kept variant does not run in this process, as our
                # kernel switched off; or a variant this machine could not run when it chose was added since):
                # compile every variant that runs, keep the fastest
                logits = self._choose_kernel(shape, args, stored=stored)
                if layers is None:
                    return logits
                # the race's last step wrote the entries the step below writes again (the same: a step is a
                # function of the entries before it)
                kind = self.kernels[shape]
        if layers is None:
            return self._call_compiled(kind, shape, args)
        logits, features = self._call_compiled(kind, shape, args, layers)
        self.hf.keep_features(layers, features)
        return logits

    def _kind(self, shape, cache) -> tuple[str | None, dict | None]:
        """The variant `shape`'s step runs in, kept in `kernels`; None (and the stored choice, if any) where it is
        to be raced first (`_choose_kernel`)."""
        if self.kernel == INVARIANT:
            return cache.invariant_kind or self.invariant_kind(), None
        kind = self.kernels.get(shape)
        if kind is None:
            if self.kernel != "auto" or self.hf.device.type != "cpu":
                kind = self.kernel
            else:
                entry = store.choice(self.hf, shape)
                if entry is None or self.offers(entry["kernel"]) is not None:
                    return None, None
                if self._untried(entry):
                    return None, entry
                kind = entry["kernel"]
            self.kernels[shape] = kind
        return kind, None

    def offers(self, kind: str) -> str | None:
        """None where kernel variant `kind` (of `KERNELS`) can run this model's compiled steps here, else why
        not."""
        if kind == INVARIANT_DPBF16:
            why = self.offers(DPBF16)
            if why is None and not dpbf16.routes_all(self.hf.model):
                why = "our kernel does not take every linear map of the model"
            return why
        if kind.removesuffix(CONCAT) != DPBF16:
            return None
        if self.hf.device.type != "cpu" or self.hf.dtype != torch.bfloat16:
            return "it multiplies bfloat16 on a CPU"
        if not self.packaging():
            return "it runs in packaged steps only"
        if self._routes is None:  # (asked at every compiled call)
            self._routes = dpbf16.routes(self.hf.model)
        return dpbf16.unavailable() if self._routes else "the model has no linear map it takes"

    def _untried(self, entry: dict) -> list[str]:
        """The variants a stored choice would have raced had they run then (those of `KERNELS`, and the kept one
        with `CONCAT`), that run here but were neither timed nor failed. A bucket that followed the ends' races
        (`store.candidates`) has none: the ends raced every variant."""
        if "from" in entry or "among" in entry:
            return []
        kept = entry["kernel"]
        kinds = (*RACED, *(() if kept.endswith(CONCAT) else (kept + CONCAT,)))
        return [k for k in kinds if k not in store.tried(entry) and self.offers(k) is None]

    def _call_compiled(self, kind, shape, args, layers: tuple[int, ...] | None = None):
        """Run `shape`'s compiled step in variant `kind` (packaged, or compiled in memory where packages are not
        kept); with `layers`, its package that returns those layers' inputs too: (logits, features)."""
        from torch._dynamo.utils import counters

        t0 = time.perf_counter()  # a process's first torch.compile imports dynamo and inductor (~0.8 s): one-time too
        kernels = kernel_options(kind) if self.hf.device.type == "cpu" else {}
        if on_dpbf16(kind) and self.offers(DPBF16) is not None:
            raise ValueError(f"kernel {kind!r} does not run here: {self.offers(DPBF16)}")
        if self.packaging():
            # a package takes the cache's buffers in the type they were exported with: one per storage type
            storage = args[4][0].dtype
            stored = self.stored_name(kind, storage)
            if layers is not None:
                stored += "+features-" + "-".join(map(str, layers))
            step = self._packages.get((stored, shape)) or self._package(kind, shape, args, kernels, t0, stored, layers)
            if step is not None:
                ids, positions, masks, slots, keys, values = args
                masks = {k: m.contiguous() for k, m in masks.items()} if isinstance(masks, dict) else masks.contiguous()
                return step(ids, positions, masks, slots, keys, values)
        if layers is not None:
            raise RuntimeError(f"{self.hf.name}'s steps are not packaged here: its hidden states come from eager steps")
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
        what = f" ({kind} kernels)" if self.hf.device.type == "cpu" else ""
        if (kind, shape) not in self._shapes:
            self._shapes.add((kind, shape))
            note(
                f"multispec: compiling {self.hf.name} for {shape[0]} x {shape[1]} new tokens{what} (once per shape and "
                "process) ..."
            )
        graphs = counters["stats"]["unique_graphs"]
        with compile_settings(kernels):
            logits = self._compiled[kind](*args)
        if counters["stats"]["unique_graphs"] != graphs:
            seconds = time.perf_counter() - t0
            self.hf.compiles += counters["stats"]["unique_graphs"] - graphs
            self.hf.compile_seconds += seconds
            note(f"multispec: compiled in {seconds:.0f} s")
        return logits

    def _choose_kernel(self, shape, args, stored: dict | None = None):
        """Compile the shape's step in every variant of `RACED` that runs here (a bucket between raced ends: in
        the variants they kept, `store.candidates`), time each whole step in place (the same feed, interleaved
        rounds), then the fastest with `CONCAT` against itself (where it has that form); keep the fastest here.
        With `stored` (a choice an earlier process made without some variant), only the kept one and the variants
        untried are raced. The last call runs the kept variant, so its logits and the cache entries it wrote are
        the kept variant's. All of it is a one-time cost."""
        t0 = time.perf_counter()
        compiled_before = self.hf.compile_seconds
        failed: list[str] = []
        among = store.candidates(self.hf, shape) if stored is None else None  # a bucket between raced ends
        if stored is None:
            runs = [k for k in among or () if self.offers(k) is None]
            if not runs:  # (no end raced yet, or their variants do not run in this process)
                among, runs = None, [k for k in RACED if self.offers(k) is None]
            seconds = self._race(shape, args, runs, failed)
        else:
            seconds = self._race(shape, args, [stored["kernel"], *self._untried(stored)], failed)
        best = min(seconds, key=seconds.get)
        tried = {*seconds, *failed, *(() if stored is None else store.tried(stored))}
        if not best.endswith(CONCAT) and best + CONCAT not in tried:
            seconds |= self._race(shape, args, [best, best + CONCAT], failed)  # the kept one timed again beside it
        kind = min(seconds, key=seconds.get)
        self.kernels[shape] = kind
        store.store_kernel(self.hf, shape, kind, seconds, failed, before=stored, among=among)
        # only the kept variant's package stays on disk (and a one-token batch-invariant step's: `_race_exact`
        # times it next)
        for other in (*VARIANTS, INVARIANT_DPBF16):
            if (
                other != kind
                and self._packages.pop((other, shape), None) is not None
                and (other, shape) != (INVARIANT_DPBF16, (1, 1))
            ):
                packaged.remove(packaged.path_for(self.package_key(), other, shape))
        logits = self._call_compiled(kind, shape, args)
        self.hf.compile_seconds = compiled_before + time.perf_counter() - t0
        note(
            f"multispec: {self.hf.name} {shape[0]} x {shape[1]}: "
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
                    f"multispec: {self.hf.name} {shape[0]} x {shape[1]}: left out the {kind} kernels "
                    f"({type(e).__name__}: {' '.join(str(e).split())[:200]})"
                )
                kinds.remove(kind)
                failed.append(kind)

        def timed() -> dict[str, float]:
            times: dict[str, list[float]] = {kind: [] for kind in kinds}
            for _ in range(CHOICE_ROUNDS):
                for kind in kinds:
                    start = time.perf_counter()
                    self._call_compiled(kind, shape, args)
                    times[kind].append(time.perf_counter() - start)
            return {kind: statistics.median(t) for kind, t in times.items()}

        # timed again while this process was off the CPU (a background worker starved by a generation beside it)
        return undisturbed(timed)[0]

    def packaging(self) -> bool:
        """Whether compiled steps are kept on disk (`models/packaged.py`): on a CPU, for a model on one device,
        unless turned off or found not to export."""
        if self._packaged is None:
            devices = set((getattr(self.hf.model, "hf_device_map", None) or {}).values())
            self._packaged = self.hf.device.type == "cpu" and len(devices) <= 1 and packaged.enabled()
        return self._packaged

    def package_key(self) -> str:
        if self._weights_key is None:
            self._weights_key = packaged.weights_fingerprint(self.hf.model)
        return f"{store.kernel_key(self.hf)}|weights={self._weights_key}"

    def _package(self, kind, shape, args, kernels, t0, stored=None, layers=None):
        """This shape's compiled step in variant `kind`, loaded from this machine's packages or compiled into
        one (a one-time cost either way), kept as `stored` (the variant, the cache's storage type and the layers
        whose inputs it returns, `layers`); None where the model does not export (it is then compiled in memory,
        per process, by torch.compile)."""
        stored = stored or kind
        path = packaged.path_for(self.package_key(), stored, shape)
        step = packaged.load(path)  # (our kernel's operator is loaded by then: `offers`, in `_call_compiled`)
        what = f"{self.hf.name} for {shape[0]} x {shape[1]} new tokens ({kind} kernels)"
        if layers is not None:
            what += f", returning the inputs of layers {', '.join(map(str, layers))}"
        run = self._step_for(kind) if layers is None else self._with_features(self._step_for(kind), layers)
        if step is None:
            note(f"multispec: compiling {what} (once per shape on this machine; kept in {path.parent}) ...")
            routed = (
                dpbf16.routed(self.hf.model, concat=kind.endswith(CONCAT))
                if on_dpbf16(kind)
                else contextlib.nullcontext()
            )
            try:
                with compile_settings(kernels), routed:
                    packaged.build(path, self.package_key(), self.hf.model, run, args, kernels)
                step = packaged.load(path)
                if step is None:
                    raise RuntimeError(f"the package written to {path} does not load")
            except Exception as e:  # noqa: BLE001 - torch.compile in this process still compiles most models
                if on_dpbf16(kind):  # our kernel runs only in packages; the others may still export
                    raise
                self._packaged = False
                note(
                    f"multispec: {self.hf.name} is compiled in memory, per process: it does not export "
                    f"({type(e).__name__}: {' '.join(str(e).split())[:200]})"
                )
                return None
            self.hf.compiles += 1
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
        self.hf.compile_seconds += time.perf_counter() - t0
        self._packages[(stored, shape)] = step
        return step
