"""Many generations at once: continuous batching over one static cache per model, one row per sequence.

Each generation runs its method as it runs alone (`generate`), in its own thread, on stand-ins for the two models
(`RowModel`) whose cache is one row of a batch cache (`static.RowKV`). A stand-in's forward does not run: it is
handed to the batch's scheduler thread and waits. The scheduler takes every waiting forward, runs the prompts
(a row's first feed) one by one, and all other feeds of a model in one forward over the rows
(`HFModel.forward_rows`), then wakes each generation with its logits. Rows join when a generation starts and
leave when it ends, between forwards.

Why this keeps every method exact, row by row: a row's verdict reads only its own logits, its own draft
probabilities and its own random generator (seeded from its request); its forward's logits do not depend on the
other rows (each row attends to its own entries only, in fixed blocks, and every step is padded to enough rows
that the matrix products sum alike: `HFModel.batch_rows`). So a sequence decoded in a batch gets the tokens it
gets decoded in a batch of one, whatever else runs (`tests/test_batching.py`).

Methods that hold several hypotheses in several cache rows (beam search and its kin, `batch-sd`, trees scored one
row per path) run alone: the scheduler runs such a generation whole between two batched forwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .models.base import LanguageModel
from .models.static import RowKV

WAIT_SECONDS = 0.02  # how long the scheduler waits for the other rows' feeds once one is waiting
PROMPT_TOKENS = 64  # a feed of more new tokens than this (a prompt) runs alone, not padded into the batch


class Cancelled(Exception):
    """A generation cancelled (its `cancel` event set) before a row was free for it."""


@dataclass
class _Feed:
    """One forward a generation waits for: its arguments, then its logits or the exception it raised."""

    role: str  # "target" or "draft"
    row: int | None  # the batch row, None for a cache of its own (a forward that runs alone)
    cache: Any
    args: tuple
    done: threading.Event = field(default_factory=threading.Event)
    logits: torch.Tensor | None = None
    error: BaseException | None = None


class RowModel(LanguageModel):
    """One generation's stand-in for a model of a batch: everything is the model's, except that its first cache is
    the generation's row of the batch cache and its forwards run on the scheduler's thread (see the module note)."""

    def __init__(self, batcher: Batcher, role: str, model, row: int):
        self._batcher, self._role, self._model, self._row = batcher, role, model, row
        self._row_cache: RowKV | None = None
        # what `LanguageModel` gives defaults for is read from the model, not the defaults
        for name in ("vocab_size", "max_length", "eos_token_id", "stop_token_ids", "tokenizer", "name", "device"):
            setattr(self, name, getattr(model, name))

    def __getattr__(self, name):  # what the generation reads of the model: names, vocabulary, costs, counters
        return getattr(self._model, name)

    @property
    def stop_tokens(self) -> frozenset[int]:
        return self._model.stop_tokens

    def prepare(self) -> None:
        return None  # a batch's steps run eagerly: nothing to settle

    def new_cache(self):
        if self._row_cache is None:
            self._row_cache = self._batcher._row_cache(self._role, self._row)
            return self._row_cache
        return self._model.new_cache()  # another cache (scoring the output afterwards): its forwards run alone

    def forward(self, cache, tokens, positions=None, mask=None, logits_to_keep=0, fused_prefix=0, batch_invariant=True):
        row = self._row if cache is self._row_cache else None
        args = (tokens, positions, mask, logits_to_keep, fused_prefix, batch_invariant)
        return self._batcher._submit(_Feed(self._role, row, cache, args))

    def crop(self, cache, length: int) -> None:
        self._model.crop(cache, length)

    def select_rows(self, cache, rows: torch.Tensor) -> None:
        self._model.select_rows(cache, rows)

    def keep_positions(self, cache, positions: torch.Tensor) -> None:
        self._model.keep_positions(cache, positions)

    def encode(self, text: str, chat: bool = True) -> list[int]:
        with self._batcher.tokenizer_lock:
            return self._model.encode(text, chat)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        with self._batcher.tokenizer_lock:
            return self._model.encode_chat(messages)

    def decode(self, ids: list[int]) -> str | None:
        with self._batcher.tokenizer_lock:
            return self._model.decode(ids)


class Batcher:
    """Continuous batching for one model pair (see the module note).

    Args:
        target, draft: `HFModel`s with a static cache (draft may be None).
        rows: sequences decoded at once; a generation that finds every row taken waits for one.
        capacity: entries a row holds (prompt, output and the drafts of one iteration).
        tokenizer_lock: held around the tokenizer (a fast tokenizer must not be used by two threads at once).

    `generate(...)` takes `multispec.generate`'s arguments after the models, from any thread; `close()` stops
    the scheduler. `stats` counts the forwards, batched or not, and the rows they held."""

    def __init__(
        self,
        target,
        draft=None,
        rows: int = 8,
        capacity: int = 2048,
        tokenizer_lock: threading.Lock | None = None,
    ):
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an integer >= 1, got {rows!r}")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
        self.models = {"target": target, "draft": draft}
        for role, model in self.models.items():
            if model is not None and not getattr(model, "static", False):
                raise ValueError(f"the {role} {model.name} cannot decode in a batch: it has no static cache")
        self.rows, self.capacity = rows, capacity
        # the row's entries: a prompt and output up to `capacity`, plus a step's padding past them
        self.caches = {
            role: model.new_batch_cache(rows, capacity + PROMPT_TOKENS + 64)
            for role, model in self.models.items()
            if model is not None
        }
        self.tokenizer_lock = tokenizer_lock or threading.Lock()
        self._lock = threading.Condition()
        self._free = list(range(rows))
        self._active: set[int] = set()
        self._waiting: list[_Feed] = []
        self._alone: list[tuple[Callable[[], Any], _Feed]] = []
        self._closed = False
        # batched forwards, the rows they held and their seconds; forwards run alone (prompts, other caches);
        # generations run alone (several rows, or longer than a row)
        self.stats = {"forwards": 0, "rows": 0, "seconds": 0.0, "single": 0, "whole": 0}
        self._thread = threading.Thread(target=self._schedule, name="multispec-batch", daemon=True)
        self._thread.start()

    # -- the generations' side ---------------------------------------------------------------------------------
    def generate(self, prompt, method: str | None = None, **kwargs):
        """`multispec.generate(target, draft, prompt, method, **kwargs)` with this batch's rows: returns its
        `Result`. A method that holds several hypotheses runs alone, between batched forwards."""
        from .api import DEFAULT_METHOD, _prompt_ids, generate
        from .params import parse_method

        method = method or DEFAULT_METHOD
        if isinstance(prompt, str):  # the token ids now, under the lock: the others' threads use the tokenizer too
            with self.tokenizer_lock:
                prompt = _prompt_ids(self.models["target"], prompt, kwargs.pop("chat", True))
        # a row holds the prompt, the output and one iteration's drafts; a request that may need more runs alone
        room = len(prompt) + kwargs.get("max_new_tokens", 128) + PROMPT_TOKENS
        if not _one_row(*parse_method(method), kwargs) or room > self.capacity:
            return self.alone(lambda: generate(self.models["target"], self.models["draft"], prompt, method, **kwargs))
        row = self._take_row(kwargs.get("cancel"))
        if row is None:
            raise Cancelled("cancelled while waiting for a row")
        try:
            target = RowModel(self, "target", self.models["target"], row)
            draft = RowModel(self, "draft", self.models["draft"], row) if self.models["draft"] is not None else None
            return generate(target, draft, prompt, method, **kwargs)
        finally:
            self._give_row(row)

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

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=30)

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
                while not (self._waiting or self._alone or self._closed):
                    self._lock.wait()
                if self._closed and not (self._waiting or self._alone):
                    return
                # once a feed waits, give the other active rows a moment to send theirs (they verify between
                # forwards): a fuller batch costs about what a thin one does
                deadline = time.monotonic() + WAIT_SECONDS
                while (
                    not self._alone
                    and len({f.row for f in self._waiting if f.row is not None}) < len(self._active)
                    and time.monotonic() < deadline
                ):
                    self._lock.wait(max(0.0, deadline - time.monotonic()))
                feeds, self._waiting = self._waiting, []
                alone, self._alone = self._alone, []
            for work, feed in alone:
                self._run(feed, work)
            batched: dict[str, list[_Feed]] = {}
            for feed in feeds:
                tokens = feed.args[0]
                if feed.row is None or feed.cache.length == 0 or tokens.shape[-1] > PROMPT_TOKENS:
                    self._run(feed, lambda f=feed: self.models[f.role].forward(f.cache, *f.args))
                else:
                    batched.setdefault(feed.role, []).append(feed)
            for role, group in batched.items():
                self._run_rows(role, group)

    def _run(self, feed: _Feed, work: Callable[[], Any]) -> None:
        try:
            feed.logits = work()
            self.stats["whole" if feed.role == "alone" else "single"] += 1
        except BaseException as e:  # noqa: BLE001 - the generation that asked gets it
            feed.error = e
        feed.done.set()

    def _run_rows(self, role: str, group: list[_Feed]) -> None:
        model = self.models[role]
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
                feeds.append((f.row, f.cache, tokens[0], None if positions is None else positions[0], mask, keep))
                fit.append(f)
        for f in group:
            if f.error is not None:
                f.done.set()
        group = fit
        if not group:
            return
        try:
            out = model.forward_rows(self.caches[role], feeds)
            for f, logits in zip(group, out, strict=True):
                f.logits = logits[None]
        except BaseException as e:  # noqa: BLE001 - every generation of the step gets it
            for f in group:
                f.error = e
        self.stats["forwards"] += 1
        self.stats["rows"] += len(group)
        self.stats["seconds"] += time.perf_counter() - t0
        for f in group:
            f.done.set()


def _one_row(method: str, given: dict, kwargs: dict) -> bool:
    """Whether a method, with these parameters, holds one cache row (so decodes in a batch's row)."""
    from .decoding.registry import get_method

    spec = get_method(method)
    params = {**given, **{k: v for k, v in kwargs.items() if k in spec.params}}
    return spec.name in ONE_ROW and params.get("tree_attention", True) is not False


# methods that hold one cache row whatever their parameters (trees with tree attention: one row, a tree mask)
ONE_ROW = frozenset({"ar", "sd", "sd-opt", "specinfer", "mcsd", "bild"})
