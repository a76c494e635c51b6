"""Many generations at once: continuous batching over one static cache per model, one row per sequence.

Each generation runs its method as it runs alone (`generate`), in its own thread, on stand-ins for the two models
(`RowModel`) whose cache is one row of a batch cache (`static.RowKV`). A stand-in's forward does not run: it is
handed to the batch's scheduler thread and waits. The scheduler takes every waiting forward and runs all feeds of
a model in one packed forward over the rows (`HFModel.forward_rows`), then wakes each generation with its logits.
A row's prompt joins those forwards in chunks (`PREFILL_CHUNK`), beside the rows that decode. Rows join when a
generation starts and leave when it ends, between forwards.

Why this keeps every method exact, row by row: a row's verdict reads only its own logits, its own draft
probabilities and its own random generator (seeded from its request); its forward's logits do not depend on the
other rows (each row attends to its own entries only, in fixed blocks; every step is padded to enough tokens that
the matrix products sum alike, `HFModel.batch_rows`; a prompt is cut into chunks at the same offsets whatever
else runs). So a sequence decoded in a batch gets the tokens it gets decoded in a batch of one, whatever else
runs (`tests/test_batching.py`).

Methods that hold several hypotheses in several cache rows (beam search and its kin, trees scored one row per
path), and requests longer than a row, run beside the batch: in their own thread, on caches of their own, each of
their forwards run by the scheduler on its own between two batched forwards, so that the rows decode on while
they run (a method that holds one row says so in the registry, `Method.row_entries`). One such generation runs
at a time (`LONE_GENERATIONS`); the next waits for it, as a request waits for a row."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from .batchload import BatchPrices, RowLoad
from .lockstep import Ask, Lockstep, batchable, runs_in_lockstep
from .machine import one_thread_here
from .models.base import LanguageModel, ModelView
from .models.static import RowKV

WAIT_SECONDS = 0.02  # how long the scheduler waits for the other rows' feeds once one is waiting
HOLD_SECONDS = 1.0  # the longest a row's target feed is held back while other rows draft (see `_schedule`)
PROMPT_TOKENS = 64  # a feed of more new tokens than this that is not a prompt runs alone, not packed into the batch
# a row's prompt joins the batched forwards in chunks of this many tokens, at fixed offsets (so its entries get the
# same bits whatever runs beside it), at most PREFILL_TOKENS of prompts in one forward (at least one chunk): the
# decoding rows wait for a chunk, not for a whole prompt
PREFILL_CHUNK = 64
PREFILL_TOKENS = 256
# generations beside the batch at once (several cache rows, or longer than a row): each holds caches of its own,
# outside the batch's, and each of their forwards holds the decoding rows for its time
LONE_GENERATIONS = 1


class Cancelled(Exception):
    """A generation cancelled (its `cancel` event set) before a row was free for it."""


@dataclass(eq=False)
class _Asked:
    """A generation that decodes in the batch's lockstep rows: what it asks, then its `Result` or its error."""

    ask: Ask
    done: threading.Event = field(default_factory=threading.Event)
    since: float = field(default_factory=time.perf_counter)
    waited: float = 0.0  # seconds until a row was free for it
    result: Any = None
    error: BaseException | None = None


@dataclass
class _Feed:
    """One forward a generation waits for: its arguments, then its logits or the exception it raised."""

    role: str  # "target" or "draft"
    row: int | None  # the batch row, None for a cache of its own (a forward that runs alone)
    cache: Any
    args: tuple
    done: threading.Event = field(default_factory=threading.Event)
    since: float = field(default_factory=time.monotonic)
    logits: torch.Tensor | None = None
    error: BaseException | None = None
    model: Any = None  # the model to run it on, when not the role's (a draft with a reduced head, `with_head_rows`)
    layers: tuple[int, ...] | None = None  # the layers whose inputs to keep (a feature-level draft's target)
    beside: bool = False  # of a generation beside the batch (it holds no row: every active row waits for it)
    features: list | None = None  # then: per layer, [1, n, hidden] of the fed tokens
    # a prompt fed in chunks (`Batcher._chunks`): its tokens fed so far, and the kept logits and features so far;
    # a chunk's feed: the prompt's feed, and how many of its logits the prompt keeps
    fed: int = 0
    parts: list = field(default_factory=list)
    parent: _Feed | None = None
    kept: int = 0
    # the seconds of the forwards it ran in, and its share of them (by tokens fed): a row's time split in a batch
    ran: float = 0.0
    shared: float = 0.0


class RowModel(ModelView):
    """One generation's stand-in for a model of a batch: everything is the model's, except that its first cache is
    the generation's row of the batch cache and its forwards run on the scheduler's thread (see the module note)."""

    def __init__(self, batcher: Batcher, role: str, model, row: int | None):
        super().__init__(model)
        self._batcher, self._role, self._row = batcher, role, row
        self._row_cache: RowKV | None = None  # (row None: a generation beside the batch, on caches of its own)
        # seconds of this row's forward calls, of the forwards they ran in, and its share of those (by tokens)
        self.called = self.ran = self.shared = 0.0
        self._capture: tuple[tuple[int, ...], list] | None = None  # `hidden_features`: the layers, where to put them
        if role == "target" and batcher.batched and row is not None:
            self.batch_load = RowLoad(batcher, row)

    def prepare(self) -> None:
        if self._row is None:  # a generation beside the batch: its model decides what it decides alone
            self._batcher.alone(self._model.prepare)
        return None  # a batch's steps run eagerly: nothing to settle

    def new_cache(self):
        if self._row_cache is None and self._row is not None and self._role in self._batcher.caches:
            self._row_cache = self._batcher._row_cache(self._role, self._row)
            return self._row_cache
        return self._model.new_cache()  # another cache (scoring the output afterwards): its forwards run alone

    def score_cache(self):
        """The cache `likelihood.mean_logprob` scores the output in once the generation is over: the generation's
        row, emptied (its entries are not read again), so that the scoring forward is fed in chunks with the other
        rows' steps instead of alone."""
        if self._row_cache is None:
            return self._model.new_cache()
        self._model.crop(self._row_cache, 0)
        return self._row_cache

    def forward(self, cache, tokens, positions=None, mask=None, logits_to_keep=0, fused_prefix=0, batch_invariant=True):
        row = self._row if cache is self._row_cache else None
        args = (tokens, positions, mask, logits_to_keep, fused_prefix, batch_invariant)
        capture = self._capture
        layers = capture[0] if capture else None
        feed = _Feed(self._role, row, cache, args, model=self._model, layers=layers, beside=self._row is None)
        start = time.perf_counter()
        try:
            logits = self._batcher._submit(feed)
        finally:
            self.called += time.perf_counter() - start
            self.ran += feed.ran
            self.shared += feed.shared
        if capture is not None:
            capture[1].extend(feed.features)
        return logits

    @contextlib.contextmanager
    def hidden_features(self, layers: tuple[int, ...]):
        """The model's `hidden_features`, for forwards that run on the scheduler's thread (`models.features`)."""
        if not hasattr(self._model, "hidden_features"):
            raise ValueError(f"{self.name} does not expose its hidden states")
        out: list = []
        self._capture = (tuple(layers), out)
        try:
            yield out
        finally:
            self._capture = None

    def measure_alone(self, measure: Callable[[Any], Any]) -> Any:
        """`measure(model)` on the model itself, on the scheduler's thread between batched forwards (a cost curve
        measured through this stand-in would take its row's cache and run its forwards one by one)."""
        if self._batcher._thread is threading.current_thread():  # already between forwards
            return measure(self._model)
        return self._batcher.alone(lambda: measure(self._model))

    def with_head_rows(self, ids: torch.Tensor, draft_vocab: int | None = None) -> RowModel | None:
        """This row on the model with an output head of only the rows `ids` (a reduced draft vocabulary,
        `multispec.models.vocab`; `draft_vocab` as `HFModel.with_head_rows` takes it): the same row of the same
        batch cache, whose batched forwards run the cut head."""
        if not hasattr(type(self._model), "with_head_rows"):
            return None  # a model without one is masked whole (`reduce_vocab`)
        return RowModel(self._batcher, self._role, self._model.with_head_rows(ids, draft_vocab), self._row)

    def encode(self, text: str, chat: bool = True) -> list[int]:
        with self._batcher.tokenizer_lock:
            return self._model.encode(text, chat)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        with self._batcher.tokenizer_lock:
            return self._model.encode_chat(messages)

    def decode(self, ids: list[int]) -> str | None:
        with self._batcher.tokenizer_lock:
            return self._model.decode(ids)


class Batcher(BatchPrices):
    """Continuous batching for one model pair (see the module note).

    Args:
        target, draft: the models (draft may be None). `HFModel`s with a static cache decode in one forward
            over the rows; other models (the exact test models, a dynamic cache) keep a cache per sequence, and
            the scheduler runs their forwards one after another, so that the batch's logic (rows joining and
            leaving, per-row random streams) runs, and is checked, on every `LanguageModel`.
        rows: sequences decoded at once; a generation that finds every row taken waits for one.
        capacity: entries a row holds (prompt, output and the drafts of one iteration).
        tokenizer_lock: held around the tokenizer (a fast tokenizer must not be used by two threads at once).
        scheduler: start the scheduler (which runs every forward) on a thread of its own; False: the owner runs
            it with `drive()`, from the main thread where it can (see `drive`).

    `generate(...)` takes `multispec.generate`'s arguments after the models, from any thread; `close()` stops
    the scheduler. `stats` counts the forwards, batched or not, and the rows they held."""

    def __init__(
        self,
        target,
        draft=None,
        rows: int = 8,
        capacity: int = 2048,
        tokenizer_lock: threading.Lock | None = None,
        scheduler: bool = True,
    ):
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an integer >= 1, got {rows!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        self.models = {"target": target, "draft": draft}
        given = {role: model for role, model in self.models.items() if model is not None}
        # whether every model decodes in batched forwards (else each sequence keeps caches of its own); a
        # feature-level draft (`models.eagle`) keeps a cache per sequence beside a batched target, and its rows'
        # forwards run one after another (it reads its target's hidden states from the batched forwards)
        head = getattr(draft, "reads_target_features", False)
        self.batched = all(batchable(m) or (role == "draft" and head) for role, m in given.items())
        self.rows, self.capacity = rows, capacity
        # the row's entries: a prompt and output up to `capacity`, plus a step's padding past them
        self.caches = (
            {
                role: model.new_batch_cache(rows, capacity + PROMPT_TOKENS + 64)
                for role, model in given.items()
                if batchable(model)
            }
            if self.batched
            else {}
        )
        for model in given.values():  # measured once per machine (about a second): not in the first request's time
            if batchable(model):
                _ = model.batch_rows
        self._init_prices()  # the batch's prices and its rows' draft choices (`RowLoad`)
        self.tokenizer_lock = tokenizer_lock or threading.Lock()
        self._lock = threading.Condition()
        self._free = list(range(rows))
        self._active: set[int] = set()
        self._waiting: list[_Feed] = []
        self._alone: list[tuple[Callable[[], Any], _Feed]] = []
        self._beside = threading.BoundedSemaphore(LONE_GENERATIONS)
        self._closed = False
        # batched forwards, the rows they held and their seconds; forwards run alone (prompts, other caches); work
        # run alone on the scheduler's thread (measuring a cost curve); generations beside the batch (several rows,
        # or longer than a row)
        self.stats = {"forwards": 0, "rows": 0, "seconds": 0.0, "single": 0, "whole": 0, "beside": 0}
        # forwards run alone while other rows decode (scoring an output, a method of several rows): the others wait
        # that long, in all and the most; prompts' chunks in batched forwards, and their tokens
        self.stats.update(stalls=0, stall_seconds=0.0, stall_max=0.0, prefill_chunks=0, prefill_tokens=0)
        self.stats["prefill_shared"] = 0  # batched forwards that fed prompts' chunks and decoding rows together
        self._prefilling: dict[str, list[_Feed]] = {}  # per model: prompts fed in chunks, in arrival order
        # chains (`ar`, `sd`) decode in lockstep on the same caches, their rows taken from the same free list, one
        # lockstep iteration per scheduler round: waiting for a row, and in a row (by batch row)
        self._lockstep = Lockstep(target, draft, rows, capacity, caches=self.caches)
        self._asks: list[_Asked] = []
        self._stepping: dict[int, tuple[Any, _Asked]] = {}
        self._thread: threading.Thread | None = None
        self._own_thread = scheduler  # (a driven scheduler's thread is its caller's, not joined by `close`)
        if scheduler:
            self._thread = threading.Thread(target=self._schedule, name="multispec-batch", daemon=True)
            self._thread.start()

    # -- the generations' side ---------------------------------------------------------------------------------
    def generate(self, prompt, method: str | None = None, **kwargs):
        """`multispec.generate(target, draft, prompt, method, **kwargs)` with this batch's rows: returns its
        `Result`. A method that holds several hypotheses, or a request longer than a row, runs beside the batch
        (see the module note)."""
        from .api import DEFAULT_METHOD, _prompt_ids, generate
        from .params import parse_method

        if threading.current_thread() not in (threading.main_thread(), self._thread):
            one_thread_here()  # a row's own tensor work stays on its thread (see there)
        method = method or DEFAULT_METHOD
        if isinstance(prompt, str):  # the token ids now, under the lock: the others' threads use the tokenizer too
            with self.tokenizer_lock:
                prompt = _prompt_ids(self.models["target"], prompt, kwargs.pop("chat", True))
        # a row holds the prompt, the output and one iteration's entries; a request that may need more runs beside
        iteration = iteration_entries(*parse_method(method), kwargs)
        room = len(prompt) + kwargs.get("max_new_tokens", 128) + (iteration or 0)
        if self.batched and (iteration is None or room > self.capacity):
            return self._generate_beside(prompt, method, kwargs)
        ask = self._lockstep_ask(prompt, method, kwargs)
        if ask is not None:
            return self._generate_in_lockstep(ask, kwargs.get("cancel"))
        asked = time.perf_counter()
        row = self._take_row(kwargs.get("cancel"))
        if row is None:
            raise Cancelled("cancelled while waiting for a row")
        waited = time.perf_counter() - asked
        try:
            target = RowModel(self, "target", self.models["target"], row)
            draft = RowModel(self, "draft", self.models["draft"], row) if self.models["draft"] is not None else None
            result = generate(target, draft, prompt, method, **kwargs)
        finally:
            self._give_row(row)
        result.stats["queue_seconds"] = waited  # waiting for a row (`multispec serve`'s queue time)
        models = [m for m in (target, draft) if m is not None]
        # the row's time split in the batch: its share (by tokens fed) of the forwards it ran in, per model, and
        # the time its forward calls waited for the others' work (gathering a batch, prompts' chunks, runs alone)
        result.stats["batch_target_share_seconds"] = target.shared
        result.stats["batch_draft_share_seconds"] = draft.shared if draft is not None else 0.0
        result.stats["batch_waiting_seconds"] = max(0.0, sum(m.called - m.ran for m in models))
        return result

    def _lockstep_ask(self, prompt: list[int], method: str, kwargs: dict) -> Ask | None:
        """The request as a lockstep row (`Ask`) when its method runs in lockstep (`runs_in_lockstep`), else None.
        Checked here, on the asking thread, as `generate` checks it: a bad request raises before it waits."""
        from .api import _prompt_ids, check_compatible, check_room
        from .params import parse_method

        name, given = parse_method(method)
        seed = kwargs.get("seed", 0)
        params, sampling = _checked(name, given, kwargs, seed)
        target, draft = self.models["target"], self.models["draft"]
        chain = runs_in_lockstep(target, draft, name, params, sampling)
        if chain is None:
            return None
        prompt = _prompt_ids(target, prompt, False)  # (token ids by now: this checks them)
        check_room(target, prompt)
        if chain["gamma"] and draft is not None and chain["drafter"] in ("model", "hybrid"):
            check_compatible(target, draft)
        return Ask(
            prompt,
            kwargs.get("max_new_tokens", 128),
            seed if seed is not None else int(torch.seed() % 2**63),
            sampling,
            chain,
            kwargs.get("on_tokens"),
            kwargs.get("cancel"),
            kwargs.get("score", True),
        )

    def _generate_in_lockstep(self, ask: Ask, cancel):
        """Decode `ask` in the batch's lockstep rows (the scheduler runs them): its `Result`."""
        asked = _Asked(ask)
        with self._lock:
            self._check_open()
            self._asks.append(asked)
            self._lock.notify_all()
        while not asked.done.wait(0.1):
            if cancel is not None and cancel.is_set():
                with self._lock:
                    if asked in self._asks:  # still waiting for a row
                        self._asks.remove(asked)
                        raise Cancelled("cancelled while waiting for a row")
        if asked.error is not None:
            raise asked.error
        asked.result.stats["queue_seconds"] = asked.waited
        return asked.result

    def _generate_beside(self, prompt: list[int], method: str, kwargs: dict):
        """A generation beside the batch: on stand-ins without a batch row, whose caches are their own and whose
        forwards the scheduler runs one at a time between batched forwards; `LONE_GENERATIONS` at once."""
        from .api import generate

        cancel = kwargs.get("cancel")
        asked = time.perf_counter()
        while not self._beside.acquire(timeout=0.1):
            self._check_open()
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled while waiting for the generation beside the batch")
        waited = time.perf_counter() - asked
        try:
            self._check_open()
            target = RowModel(self, "target", self.models["target"], None)
            draft = RowModel(self, "draft", self.models["draft"], None) if self.models["draft"] is not None else None
            result = generate(target, draft, prompt, method, **kwargs)
        finally:
            self._beside.release()
        self.stats["beside"] += 1
        result.stats["queue_seconds"] = waited
        return result

    def alone(self, work: Callable[[], Any]):
        """Run `work` on the scheduler's thread, between batched forwards, with no row's forward at once."""
        feed = _Feed("alone", None, None, ())
        with self._lock:
            self._check_open()
            self._alone.append((work, feed))
            self._lock.notify_all()
        feed.done.wait()
        if feed.error is not None:
            raise feed.error
        return feed.logits

    def drive(self) -> None:
        """Run the scheduler in the calling thread until `close()` (for a Batcher made with scheduler=False).

        Call it from the main thread: torch's CPU operators run their parallel parts on OpenMP, and GNU OpenMP
        keeps its worker threads waiting only for the main thread's parallel regions; a region started on any
        other thread starts its workers again, a cost per region that can double a batched step (measured in
        docs/decisions.md). If the scheduler fails, every generation waiting on it gets the error."""
        if self._thread is not None:
            raise RuntimeError("this batch's scheduler runs on its own thread")
        self._thread = threading.current_thread()
        try:
            self._schedule()
        except BaseException as e:
            self._fail_pending(e)
            raise

    def _fail_pending(self, error: BaseException) -> None:
        with self._lock:
            self._closed = True
            feeds = [*self._waiting, *(f for _, f in self._alone), *(f for p in self._prefilling.values() for f in p)]
            self._waiting, self._alone, self._prefilling = [], [], {}
            asks = [*self._asks, *(a for _, a in self._stepping.values())]
            self._asks, self._stepping = [], {}
            self._lock.notify_all()
        for feed in feeds:
            feed.error = error
            feed.done.set()
        for asked in asks:
            asked.error = error
            asked.done.set()

    @property
    def active_rows(self) -> int:
        """Sequences decoding in the batch now (in threads and in lockstep)."""
        return len(self._active) + len(self._stepping)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._own_thread and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _measure(self, work: Callable[[], Any]):
        return self.alone(work)  # on the scheduler's thread, between batched forwards

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this batch is closed")

    def _take_row(self, cancel) -> int | None:
        with self._lock:
            while not self._free:
                self._check_open()
                if cancel is not None and cancel.is_set():
                    return None
                self._lock.wait(0.1)
            self._check_open()
            row = self._free.pop(0)  # the lowest: the batched forwards span rows 0 .. highest active
            self._free.sort()
            self._active.add(row)
            return row

    def _give_row(self, row: int) -> None:
        with self._lock:
            self._active.discard(row)
            self._forget(row)
            self._free.append(row)
            self._free.sort()
            for cache in self.caches.values():
                view = getattr(cache, "views", {}).pop(row, None)
                if view is not None:
                    view.length = 0
            self._lock.notify_all()

    def _row_cache(self, role: str, row: int) -> RowKV:
        cache = RowKV(self.caches[role], row)
        cache.capacity = self.capacity  # the rest of the batch cache's room is for a step's padding
        return cache

    def _submit(self, feed: _Feed) -> torch.Tensor:
        with self._lock:
            self._check_open()
            self._waiting.append(feed)
            self._lock.notify_all()
        feed.done.wait()
        if feed.error is not None:
            raise feed.error
        return feed.logits

    # -- the scheduler's side ----------------------------------------------------------------------------------
    def _schedule(self) -> None:
        while True:
            with self._lock:
                while not (
                    self._waiting
                    or self._alone
                    or self._closed
                    or self._prefills()
                    or self._stepping
                    or (self._asks and self._free)
                ):
                    self._lock.wait()
                if self._closed:  # what has no row yet will not get one
                    for asked in self._asks:
                        asked.error = RuntimeError("this batch is closed")
                        asked.done.set()
                    self._asks = []
                if self._closed and not (self._waiting or self._alone or self._prefills() or self._stepping):
                    return
                admitted = []
                while self._asks and self._free:  # the lowest free row first, as `_take_row` takes it
                    admitted.append((self._asks.pop(0), self._free.pop(0)))
                # once a feed waits, give the other active rows a moment to send theirs (they verify between
                # forwards): a fuller batch costs about what a thin one does
                deadline = time.monotonic() + (WAIT_SECONDS if self.batched else 0.0)
                while (
                    not self._alone
                    and len({f.row for f in self._waiting if f.row is not None} | self._prefilling_rows())
                    < len(self._active)
                    and time.monotonic() < deadline
                ):
                    self._lock.wait(max(0.0, deadline - time.monotonic()))
                feeds, self._waiting = self._waiting, []
                alone, self._alone = self._alone, []
            for work, feed in alone:
                self._run(feed, work)
            for asked, row in admitted:
                self._join_lockstep(asked, row)
            batched: dict[str, list[_Feed]] = {}
            for feed in feeds:
                tokens = feed.args[0]
                if self._chunked(feed):
                    self._prefilling.setdefault(feed.role, []).append(feed)
                elif feed.row is None or feed.cache.length == 0 or tokens.shape[-1] > PROMPT_TOKENS:
                    self._run(feed, lambda f=feed: self._forward_alone(f))
                else:
                    batched.setdefault(feed.role, []).append(feed)
            held = self._hold(batched)
            chunks = self._chunks()
            for role, part in chunks.items():
                batched.setdefault(role, []).extend(part)
            for role, group in batched.items():
                # one forward per model: a draft with a reduced head runs its rows apart (the cache is shared)
                by_model: dict[int, list[_Feed]] = {}
                for feed in group:
                    by_model.setdefault(id(feed.model or self.models[role]), []).append(feed)
                for part in by_model.values():
                    self._run_rows(role, part)
            for part in chunks.values():
                self._join_chunks(part)
            if self._stepping:
                self._step_lockstep()
            if held:
                with self._lock:
                    self._waiting[:0] = held

    def _join_lockstep(self, asked: _Asked, row: int) -> None:
        asked.waited = time.perf_counter() - asked.since
        try:
            self._stepping[row] = (self._lockstep.join(asked.ask, row), asked)
        except Exception as e:  # noqa: BLE001 - the request's own error, reported to it
            asked.error = e
            asked.done.set()
            self._give_row(row)

    def _step_lockstep(self) -> None:
        """One lockstep iteration over the batch's lockstep rows (`Lockstep.step`); the rows that ended leave with
        their results. If the iteration fails, every row in it gets the error, and the batch goes on."""
        from .models.hf import background

        lockstep = self._lockstep
        before = dict(lockstep.stats)
        rows = [row for row, _ in self._stepping.values()]
        try:
            with background.paused():  # no background compile beside decoding
                ended = lockstep.step(rows)
        except Exception as e:  # noqa: BLE001 - reported to the generations it belonged to
            ended, failed = rows, e
        else:
            failed = None
        for key in ("forwards", "rows", "seconds", "prefill_chunks", "prefill_tokens"):
            self.stats[key] += lockstep.stats[key] - before[key]
        for row in ended:
            _, asked = self._stepping.pop(row.slot)
            try:
                if failed is not None:
                    raise failed
                asked.result = lockstep.finish(row)
            except Exception as e:  # noqa: BLE001 - the request's own error, reported to it
                asked.error = e
                lockstep._leave(row.slot)
            finally:
                self._give_row(row.slot)
                asked.done.set()

    def _prefills(self) -> bool:
        return any(self._prefilling.values())

    def _prefilling_rows(self) -> set[int]:
        return {f.row for part in self._prefilling.values() for f in part}

    def _chunked(self, feed: _Feed) -> bool:
        """Whether a feed is a prompt that joins the batched forwards in chunks: the first feed of a batch row (a
        prompt, and maybe a chain or tree drafted after it), no entry seeing one fed after it."""
        tokens, _, mask = feed.args[:3]
        if not (feed.row is not None and feed.role in self.caches and feed.cache.length == 0):
            return False
        if tokens.dim() != 2 or tokens.shape[0] != 1:
            return False
        return mask is None or not bool(mask.reshape(tokens.shape[-1], -1).triu(1).any())

    def _chunks(self) -> dict[str, list[_Feed]]:
        """The next chunk of each prompt being fed, per model, in arrival order, up to PREFILL_TOKENS in all (at
        least one): feeds of their own, each pointing at its prompt's (`_join_chunks`)."""
        out: dict[str, list[_Feed]] = {}
        for role, pending in self._prefilling.items():
            budget = PREFILL_TOKENS
            for feed in list(pending):
                tokens, positions, mask, keep, fused, invariant = feed.args
                n = tokens.shape[-1]
                start, end = feed.fed, min(n, feed.fed + PREFILL_CHUNK)
                if end - start > budget and out.get(role):
                    break
                budget -= end - start
                keep = keep or n
                # the fused prefix as `HFModel.forward` takes it: the prompt's first tokens, none of them kept
                fused = min(fused, end) if start == 0 and keep <= n - fused else 0
                kept = max(0, end - max(start, n - keep))  # this chunk's tokens among those the prompt keeps
                args = (
                    tokens[:, start:end],
                    None if positions is None else positions[:, start:end],
                    None if mask is None else mask.reshape(1, n, -1)[:, start:end, :end],
                    max(kept, 1),
                    fused,
                    invariant,
                )
                chunk = _Feed(role, feed.row, feed.cache, args, model=feed.model, layers=feed.layers)
                chunk.parent, chunk.kept = feed, kept
                out.setdefault(role, []).append(chunk)
                feed.fed = end
                if end == n:
                    pending.remove(feed)
                self.stats["prefill_chunks"] += 1
                self.stats["prefill_tokens"] += end - start
        return out

    def _join_chunks(self, chunks: list[_Feed]) -> None:
        """A chunk's logits and features into its prompt's feed; the prompt's generation wakes after its last
        chunk, or at the first that failed."""
        for chunk in chunks:
            feed = chunk.parent
            if feed.done.is_set():
                continue
            if chunk.error is not None:
                feed.error = chunk.error
                pending = self._prefilling.get(feed.role, [])
                if feed in pending:
                    pending.remove(feed)
                feed.done.set()
                continue
            feed.parts.append(
                (chunk.logits[:, chunk.logits.shape[1] - chunk.kept :] if chunk.kept else None, chunk.features)
            )
            if feed.fed == feed.args[0].shape[-1] and feed not in self._prefilling.get(feed.role, []):
                logits = [p[0] for p in feed.parts if p[0] is not None]
                feed.logits = torch.cat(logits, 1)
                if feed.layers:
                    feed.features = [torch.cat([p[1][i] for p in feed.parts], 1) for i in range(len(feed.layers))]
                feed.parts = []
                feed.done.set()

    @staticmethod
    def _hold(batched: dict[str, list[_Feed]]) -> list[_Feed]:
        """The target feeds to hold back while other rows still draft: a row that drafts sends its chain to the
        target after a few cheap draft forwards, and one target forward over every row costs about what one
        over a few rows does (the step is padded to `batch_rows`), so the target waits for them (at most
        `HOLD_SECONDS` a feed). Removes them from `batched` and returns them."""
        if "draft" not in batched or "target" not in batched:
            return []
        now = time.monotonic()
        held = [f for f in batched["target"] if now - f.since < HOLD_SECONDS]
        batched["target"] = [f for f in batched["target"] if now - f.since >= HOLD_SECONDS]
        if not batched["target"]:
            del batched["target"]
        return held

    def _forward_alone(self, feed: _Feed) -> torch.Tensor:
        model = feed.model or self.models[feed.role]
        if not feed.layers:
            return model.forward(feed.cache, *feed.args)
        with model.hidden_features(feed.layers) as seen:
            logits = model.forward(feed.cache, *feed.args)
        feed.features = list(seen)
        return logits

    def _run(self, feed: _Feed, work: Callable[[], Any]) -> None:
        start = time.perf_counter()
        try:
            feed.logits = work()
            self.stats["whole" if feed.role == "alone" else "single"] += 1
        except BaseException as e:  # noqa: BLE001 - the generation that asked gets it
            feed.error = e
        feed.ran = feed.shared = time.perf_counter() - start
        # the rows waited for it: every active row for a generation beside the batch; the others for a row's own
        # forward on another cache (not for a head's step, which runs beside its row's)
        held = bool(self.active_rows) if feed.beside else (self.active_rows > 1 and feed.role != "draft")
        if held:
            seconds = time.perf_counter() - start
            self.stats["stalls"] += 1
            self.stats["stall_seconds"] += seconds
            self.stats["stall_max"] = max(self.stats["stall_max"], seconds)
        feed.done.set()

    def _run_rows(self, role: str, group: list[_Feed]) -> None:
        model = group[0].model or self.models[role]
        t0 = time.perf_counter()
        feeds, fit = [], []
        for f in group:  # a feed that cannot run fails its own generation only
            tokens, positions, mask, keep, _, _ = f.args
            if tokens.shape[0] != 1:
                f.error = ValueError("a sequence in a batch feeds one row")
            elif f.cache.length + tokens.shape[-1] > f.cache.capacity:
                f.error = ValueError(
                    f"a sequence in this batch holds at most {f.cache.capacity} entries, "
                    f"{f.cache.length + tokens.shape[-1]} asked for"
                )
            else:
                fused = f.args[4] if f.cache.length == 0 else 0
                feeds.append(
                    (f.row, f.cache, tokens[0], None if positions is None else positions[0], mask, keep, fused)
                )
                fit.append(f)
        for f in group:
            if f.error is not None:
                f.done.set()
        group = fit
        if not group:
            return
        tokens = sum(f.args[0].shape[-1] for f in group)
        layers = tuple(sorted({i for f in group for i in f.layers or ()}))
        try:
            with model.hidden_features(layers) if layers else contextlib.nullcontext([]) as seen:
                out = model.forward_rows(self.caches[role], feeds)
            by_layer = dict(zip(layers, seen, strict=True))
            start = 0  # the feeds' tokens sit one after another in the packed step
            for f, logits in zip(group, out, strict=True):
                f.logits = logits[None]
                n = f.args[0].shape[-1]
                if f.layers:  # its row's hidden states of the tokens it fed
                    f.features = [by_layer[i][:, start : start + n] for i in f.layers]
                start += n
        except BaseException as e:  # noqa: BLE001 - every generation of the step gets it
            for f in group:
                f.error = e
        seconds = time.perf_counter() - t0
        for f in group:
            f.ran, f.shared = seconds, seconds * f.args[0].shape[-1] / tokens
            if f.parent is not None:  # a prompt's chunk: the prompt's generation waits for every chunk
                f.parent.ran += f.ran
                f.parent.shared += f.shared
        self.stats["forwards"] += 1
        self.stats["rows"] += len(group)
        chunks = sum(1 for f in group if f.parent is not None)
        self.stats["prefill_shared"] += 0 < chunks < len(group)
        self.stats["seconds"] += seconds
        self._timed(role, t0, seconds, tokens, decoding=not any(f.parent for f in group))
        for f in group:
            f.done.set()


MAX_BATCH = 64  # the most sequences `generate_batch` decodes at once


def generate_batch(
    target: LanguageModel,
    draft: LanguageModel | None,
    prompts: list[str] | list[list[int]],
    method: str | None = None,
    seed: int | None = 0,
    rows: int | None = None,
    on_result: Callable[[int, Any], None] | None = None,
    **kwargs,
) -> list:
    """`generate` for many prompts, decoded together: continuous batching (`multispec.Batcher`), one cache row
    per sequence and one forward per model over the rows; sequences join and leave between forwards.

    Args:
        target, draft, method: as for `generate`.
        prompts: texts or token-id lists, one per sequence.
        seed: prompt i is seeded `seed + i` (so its output is the one `generate` gives with that seed, at
            temperature 0 always and at any temperature with a fixed draft length); None: fresh seeds.
        rows: at most this many sequences at once (default: all of them, up to `MAX_BATCH`).
        on_result: called with (i, prompt i's `Result`) as each ends, from the thread that decoded it (so that a
            caller can keep finished work before the last ends).
        **kwargs: `generate`'s other arguments (`max_new_tokens`, `temperature`, `chat`, method parameters...).

    Returns:
        One `Result` per prompt, in order.

    Raises:
        ValueError: no prompts, a bad `rows`, or a bad request (as `generate` names it).
    """
    from .api import _prompt_ids
    from .params import DEFAULT_METHOD, parse_method

    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of texts or token-id lists")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_BATCH):
        raise ValueError(f"rows must be an integer from 1 to {MAX_BATCH}, got {rows!r}")
    chat = kwargs.pop("chat", True)
    ids = [_prompt_ids(target, prompt, chat) for prompt in prompts]
    method = method or DEFAULT_METHOD
    name, given = parse_method(method)
    params, sampling = _checked(name, given, kwargs, None if seed is None else seed + len(ids) - 1)  # before threads
    rows = min(len(ids), rows or MAX_BATCH)
    capacity = max(map(len, ids)) + kwargs.get("max_new_tokens", 128) + (iteration_entries(name, given, kwargs) or 0)
    chain = runs_in_lockstep(target, draft, name, params, sampling)
    if chain is not None:  # chains, the work besides forwards for all rows at once
        from .api import check_compatible, check_room
        from .models.hf import background

        uses_draft = chain["gamma"] and draft is not None and chain["drafter"] in ("model", "hybrid")
        if uses_draft:
            check_compatible(target, draft)
        for i, prompt in enumerate(ids):
            check_room(target, prompt, f"prompt {i}")
        seeds = [seed + i if seed is not None else int(torch.seed() % 2**63) for i in range(len(ids))]
        batch = Lockstep(target, draft if uses_draft else None, rows=rows, capacity=capacity)
        with background.paused():  # no background compile beside decoding
            return batch.run(
                ids,
                kwargs.get("max_new_tokens", 128),
                seeds,
                sampling,
                chain,
                on_result,
                kwargs.get("on_tokens"),
                kwargs.get("cancel"),
                kwargs.get("score", True),
            )
    # the forwards run on this thread (the main one, usually: `Batcher.drive`), the rows' logic on a pool
    batcher = Batcher(target, draft, rows=rows, capacity=capacity, scheduler=False)
    left = [len(ids)]
    counted = threading.Lock()

    def one(i: int):
        try:
            result = batcher.generate(ids[i], method, seed=None if seed is None else seed + i, **kwargs)
            if on_result is not None:
                on_result(i, result)
            return result
        finally:
            with counted:
                left[0] -= 1
                if left[0] == 0:
                    batcher.close()  # the last one: the scheduler returns once nothing is pending

    with ThreadPoolExecutor(rows, thread_name_prefix="multispec-row") as pool:
        futures = [pool.submit(one, i) for i in range(len(ids))]
        try:
            batcher.drive()
        finally:
            batcher.close()
        return [f.result() for f in futures]


# `generate`'s own arguments (the rest are the method's parameters)
_GENERATE_ARGS = frozenset(
    {"max_new_tokens", "temperature", "top_k", "top_p", "on_tokens", "score", "cancel", "chat", "seed"}
)


def _checked(name: str, given: dict, kwargs: dict, seed) -> tuple[dict, object]:
    """A request's method parameters and warp, checked as `generate` checks them (`api.validate_request`); `kwargs`
    holds `generate`'s arguments and the method's parameters together."""
    from .api import validate_request

    _, params, sampling = validate_request(
        name,
        kwargs.get("max_new_tokens", 128),
        kwargs.get("temperature", 1.0),
        kwargs.get("top_k", 0),
        kwargs.get("top_p", 1.0),
        {**given, **{k: v for k, v in kwargs.items() if k not in _GENERATE_ARGS}},
        seed,
    )
    return params, sampling


def iteration_entries(method: str, given: dict, kwargs: dict) -> int | None:
    """The most entries one iteration of a method, with these parameters, adds past the committed ones to its row
    of either model (`Method.row_entries`), or None where it holds several cache rows (it runs beside the batch).

    Args:
        method: the method's name; given, kwargs: its parameters as parsed from the name and as passed.
    """
    from .decoding.registry import get_method

    spec = get_method(method)
    if spec.row_entries is None:
        return None
    params = {k: p.default for k, p in spec.params.items()}
    params.update(given)
    params.update({k: v for k, v in kwargs.items() if k in spec.params})
    return spec.row_entries(params)
