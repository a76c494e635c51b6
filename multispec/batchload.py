"""What a row of a batch reads of its batch to choose its drafts (`gamma=auto`, `tree=auto`): the batched forwards'
measured prices (`BatchPrices`, kept by both batch engines: the threaded `multispec.batching.Batcher` and the
lockstep `multispec.lockstep.Lockstep`) and each row's view of them (`RowLoad`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

GAP_SECONDS = 1.0  # a longer pause between two batched forwards is an idle batch, not the rows' work
POOLED_TRIES = 12  # the weight of the batch's pooled acceptance record in a joining row's (`RowLoad.pooled`)
MAX_POOLED_GAMMA = 16  # draft positions the pooled record keeps


class BatchPrices:
    """A batch's prices and its rows' draft choices, for `RowLoad`. A batch engine sets `models`, `caches` and
    `_active` (the rows decoding now), calls `_init_prices` once and `_timed` after each batched forward.

    - `curves`: per model, the batched step's cost curve (`batch_forward_cost`), measured the first time a row
      asks (then read from this machine's store); `scale`: what a batched forward costs here against it (each
      decoding forward, timed, moves it); `gap`: the seconds between two batched forwards (the rows' own work).
    - `_chosen`: per row, its last draft choice (`RowLoad.chose`); `_pooled`: per drafter option, the batch's
      tries and accepts; `_exploring`: per drafter option, the rows trying it now (`RowLoad.explores`).
    """

    models: dict[str, Any]
    caches: dict[str, Any]
    _active: set[int]

    def _init_prices(self) -> None:
        self._chosen: dict[int, tuple[int, float, int]] = {}
        self._pooled: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._exploring: dict[str, set[int]] = {}
        self.curves: dict[str, Any] = {}
        self._curves_lock = threading.Lock()
        self.scale = {"target": 1.0, "draft": 1.0}
        self.gap = 0.0
        self._last_end: float | None = None

    def _measure(self, work: Callable[[], Any]):
        """Run a measurement (a cost curve) where the batch's forwards run: here, on the caller's thread."""
        return work()

    def entries(self, role: str, rows: int, width: int) -> int:
        """The entries a batched step of a model computes for `rows` rows `width` wide (`HFModel.batch_entries`)."""
        return self.models[role].batch_entries(rows * width)

    def single_cost(self, role: str):
        """A model's cost curve for one sequence (`forward_cost`, a draft's)."""
        key = f"{role}|single"
        if key not in self.curves:
            with self._curves_lock:
                if key not in self.curves:
                    from .models.cost import forward_cost

                    model = self.models[role]
                    self.curves[key] = self._measure(lambda: forward_cost(model, batch_invariant=role == "target"))
        return self.curves[key]

    def curve(self, role: str):
        """The batched step's cost curve of a model (`batch_forward_cost`)."""
        if role not in self.curves:
            with self._curves_lock:
                if role not in self.curves:
                    from .models.cost import batch_forward_cost

                    model = self.models[role]
                    self.curves[role] = self._measure(lambda: batch_forward_cost(model, role == "target"))
        return self.curves[role]

    def _forget(self, row: int) -> None:
        """A row that left: its choice and its tries no longer price the others'."""
        self._chosen.pop(row, None)
        for rows in self._exploring.values():
            rows.discard(row)

    def _timed(self, role: str, t0: float, seconds: float, tokens: int, decoding: bool) -> None:
        """A batched forward of `role` that started at `t0`, ran `seconds` over `tokens` tokens (`decoding`: no
        prompt's piece in it): the gap before it and the scale of its curve move."""
        if self._last_end is not None and t0 - self._last_end < GAP_SECONDS:
            self.gap = 0.8 * self.gap + 0.2 * (t0 - self._last_end)
        curve = self.curves.get(role)
        if curve is not None and decoding:  # (the curve is of decoding steps, not prompts)
            ratio = seconds / max(curve(self.models[role].batch_entries(tokens)), 1e-9)
            self.scale[role] = 0.8 * self.scale[role] + 0.2 * min(4.0, max(0.25, ratio))
        self._last_end = time.perf_counter()


class RowLoad:
    """A row's view of its batch for `gamma=auto` (`DraftLength.load`), so that the rows choose their drafts for
    the batch (`../shared/specs/batching.md` section 4). A batched forward is packed (`HFModel.forward_rows`): a
    row's draft positions add its own tokens to the target's forward, not a width to every row. So a row prices
    each length as the batch's iteration, with the other rows as they last chose (`chose`):

    - the target forward over the other rows' tokens plus this row's, from the batched step's measured curve;
    - the draft forwards: one per position of the longest chain any row drafts (the target waits for it); a
      position that other rows draft too costs this row its share of that forward (1 / (rows drafting it)), a
      position beyond theirs the whole forward. Priced as free, positions beside a drafting row kept every row
      drafting once one did, where no row drafting paid more (the rows' choices met in a worse equilibrium);
    - the batch's expected committed tokens: the others' plus this row's own.

    Each row so takes the length that maximises the batch's tokens per second given the others' choices, one
    row at a time (coordinate ascent on the batch's goodput): rows that accept more draft more, and as rows join,
    a draft position must pay for itself against a fuller forward, so drafting shrinks, down to none. Everything
    it reads is past (the other rows' earlier choices and records, the count of rows), never this iteration's
    target, so each row's output law stays the target's."""

    def __init__(self, batcher: BatchPrices, row: int):
        self._batcher, self._row = batcher, row

    @property
    def rows(self) -> int:
        return max(1, len(self._batcher._active))

    @property
    def alone(self) -> bool:
        """No other row is active: the iteration is priced as a single sequence's (`DraftLength`'s own curves),
        as `generate` alone prices it. The batched step's curve and the gap between forwards overprice a lone
        row's drafting (its gap counts its own verification work once per forward)."""
        return len(self._batcher._active) <= 1

    def _others(self) -> list[tuple[int, float, int]]:
        """(tokens fed, expected tokens committed, draft positions) of every other active row's last choice; a
        row that has not chosen (or does not choose: a fixed draft length) counts one token fed and committed."""
        chosen = self._batcher._chosen
        return [chosen.get(row, (1, 1.0, 0)) for row in list(self._batcher._active) if row != self._row]

    def target_curve(self, most: int) -> list[float]:
        """[seconds of the batch's target forward with this row w tokens wide, w = 0 .. most]: the other rows'
        tokens packed beside this row's, from the batched step's own curve (`Batcher.curve`), not one sequence's."""
        batcher = self._batcher
        others = sum(width for width, _, _ in self._others())
        scale, gap, model = batcher.scale["target"], batcher.gap, batcher.models["target"]
        full = batcher.curve("target").curve(model.batch_entries(others + most))
        return [0.0] + [scale * float(full[model.batch_entries(others + w)]) + gap for w in range(1, most + 1)]

    def draft_step(self, width: int) -> float:
        """Seconds of one draft forward over every row, `width` entries wide."""
        batcher = self._batcher
        if batcher.models.get("draft") is None:  # nothing drafts with a model (copying drafters alone)
            return 0.0
        if "draft" not in batcher.caches:  # a draft whose rows run one after another (a feature-level head)
            return self.rows * batcher.single_cost("draft")(width) + batcher.gap
        entries = batcher.entries("draft", self.rows, width)
        return batcher.scale["draft"] * batcher.curve("draft")(entries) + batcher.gap

    def draft_curve(self, most: int) -> list[float]:
        """[seconds of one draft forward over every row with this row w entries wide and the others one each,
        w = 0 .. most]: a level of this row's tree (`AutoTree`) in the packed draft step."""
        batcher, others = self._batcher, self.rows - 1
        if "draft" not in batcher.caches:  # a draft whose rows run one after another (a feature-level head)
            single = batcher.single_cost("draft")
            return [0.0] + [others * single(1) + single(w) + batcher.gap for w in range(1, most + 1)]
        model = batcher.models["draft"]
        full = batcher.curve("draft").curve(model.batch_entries(others + most))
        scale = batcher.scale["draft"]
        return [0.0] + [scale * float(full[model.batch_entries(others + w)]) + batcher.gap for w in range(1, most + 1)]

    def others_drafting(self) -> int:
        """The longest chain another row drafts (its draft forwards run whatever this row chooses)."""
        return max((drafts for _, _, drafts in self._others()), default=0)

    def rows_drafting(self) -> int:
        """How many other rows draft with the draft model (they share the draft forwards this row joins)."""
        return sum(1 for _, _, drafts in self._others() if drafts > 0)

    def others(self, most: int) -> list[float]:
        """[the other active rows' expected committed tokens, as they last chose], for g = 0 .. most."""
        return [float(sum(tokens for _, tokens, _ in self._others()))] * (most + 1)

    def chose(self, width: int, tokens: float, drafts: int) -> None:
        """This row's choice for its next iteration (tokens it feeds the target, tokens it expects to commit,
        draft positions), for the other rows' prices."""
        self._batcher._chosen[self._row] = (width, tokens, drafts)

    def record(self, key: str, drafted: int, accepted: int) -> None:
        """One verification of a drafter option, into the batch's pooled record (`pooled`)."""
        self._batcher._exploring.get(key, set()).discard(self._row)
        tries, accepts = self._batcher._pooled.setdefault(key, (np.zeros(MAX_POOLED_GAMMA), np.zeros(MAX_POOLED_GAMMA)))
        tries[: min(accepted + 1, drafted, MAX_POOLED_GAMMA)] += 1
        accepts[: min(accepted, MAX_POOLED_GAMMA)] += 1

    def tried(self, key: str) -> int:
        """First-position tries of drafter option `key` over the batch's rows: recorded, and being made now."""
        recorded = self._batcher._pooled.get(key)
        return int(recorded[0][0] if recorded is not None else 0) + len(self._batcher._exploring.get(key, ()))

    def explores(self, key: str) -> None:
        """This row tries `key` with one draft in its next iteration (until it records the verdict)."""
        self._batcher._exploring.setdefault(key, set()).add(self._row)

    def pooled_record(self, key: str, tries: list[float], accepts: list[float]) -> tuple[list[float], list[float]]:
        """The batch's record of `key` (its rows' past verifications, this row's among them, scaled down as in
        `pooled`) where it holds more first-position tries than the row's own (`tries`, `accepts`)."""
        recorded = self._batcher._pooled.get(key)
        if recorded is None or min(recorded[0][0], POOLED_TRIES) <= tries[0]:
            return tries, accepts
        return self._scaled(*recorded, len(tries))

    @staticmethod
    def _scaled(tries: np.ndarray, accepts: np.ndarray, positions: int) -> tuple[list[float], list[float]]:
        """A pooled record scaled down to at most `POOLED_TRIES` first-position tries, `positions` long."""
        scale = min(1.0, POOLED_TRIES / tries[0]) if tries[0] else 0.0
        pad = max(0, positions - MAX_POOLED_GAMMA)
        return (
            [*(tries[:positions] * scale).tolist(), *[0.0] * pad],
            [*(accepts[:positions] * scale).tolist(), *[0.0] * pad],
        )

    def pooled(self, positions: int) -> dict[str, tuple[list[float], list[float]]]:
        """Every drafter option's record over the batch's rows so far, scaled down to at most `POOLED_TRIES` tries
        at the first position: a joining row's prior, which its own record soon outweighs (the spec's "pooled
        history early on"). Past verifications of other rows only, so the row's law is untouched."""
        return {
            key: self._scaled(tries, accepts, positions)
            for key, (tries, accepts) in list(self._batcher._pooled.items())
        }
