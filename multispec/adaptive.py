"""Draft length that pays: a cost curve of the target's forward and the acceptance seen so far.

`forward_cost(model)` measures T(k, c), the seconds of one forward over k new tokens on a cache of c tokens
(two lengths, interpolated), once per model, dtype, device and thread count (a few seconds; kept in memory
and, for Hugging Face models, in the cache folder). `DraftLength` keeps, per drafter key (the draft model, or a copying drafter
and its match length) and per position, how often a drafted token was accepted given that the ones before
it were. For every option it computes the expected tokens of drafting g tokens,

    E(g) = 1 + sum_{i <= g} prod_{j <= i} a_j      (a_j: acceptance at position j; the 1 is the bonus or
                                                    the replacement token)

and its cost T(g + 1) + draft forwards, and picks the option and g (0 included: a plain target step) with
the most tokens per second. The choice depends only on the past and on the drafts themselves, never on the
target's verification of this iteration, so exactness is untouched.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field

import torch

from .models.base import LanguageModel
from .proposers import Option

# the most drafts `gamma=auto` proposes; T(k) is measured up to MAX_AUTO_GAMMA + 1 tokens
MAX_AUTO_GAMMA = 10
COST_CONTEXTS = (128, 1024)  # cached tokens while measuring: attention makes long contexts dearer
# the acceptance prior: a Beta(PRIOR_ACCEPT, PRIOR_REJECT) per position (mean 1/3), so that a drafter is tried
# before its record speaks, without the optimism that picking the best-looking option adds
PRIOR_ACCEPT, PRIOR_REJECT = 1.0, 2.0
EXPLORE = 3  # one-draft tries an option gets before the controller trusts its record


@dataclass(frozen=True)
class ForwardCost:
    """seconds[c][k - 1]: one forward over k new tokens after contexts[c] cached ones. Between measured
    contexts the cost is interpolated linearly, beyond them extrapolated along the last segment (never
    below the shortest context's cost); beyond the measured k, linearly along the last step."""
    seconds: tuple[tuple[float, ...], ...]
    contexts: tuple[int, ...] = (COST_CONTEXTS[0],)

    def __post_init__(self):
        if not self.seconds or isinstance(self.seconds[0], (int, float)):  # one context given as a flat tuple
            object.__setattr__(self, "seconds", (tuple(self.seconds),))
        if len(self.contexts) != len(self.seconds):
            raise ValueError("one row of seconds per context")

    def __call__(self, k: int, context: int | None = None) -> float:
        if k <= 0:
            return 0.0
        rows = [_extend(row, k) for row in self.seconds]
        if context is None or len(rows) == 1:
            return rows[0]
        c = self.contexts
        i = max(0, min(len(c) - 2, sum(context > x for x in c[1:-1])))
        w = (context - c[i]) / (c[i + 1] - c[i])
        return max(rows[0], rows[i] + w * (rows[i + 1] - rows[i]))


def _extend(row: tuple[float, ...], k: int) -> float:
    if k <= len(row):
        return row[k - 1]
    slope = max(row[-1] - row[-2], 0.0) if len(row) > 1 else row[-1]
    return row[-1] + slope * (k - len(row))


_COSTS: dict[str, ForwardCost] = {}
calibration_seconds = 0.0  # spent measuring cost curves in this process (not decoding)


def cost_key(model: LanguageModel) -> str:
    dtype = getattr(model, "dtype", None)
    engine = "compiled" if getattr(model, "compile", False) else "static" if getattr(model, "static", False) else "eager"
    return (f"{model.name}|{dtype}|{model.device}|{engine}|threads={torch.get_num_threads()}|"
            f"torch={torch.__version__}")


def forward_cost(model: LanguageModel, max_tokens: int = MAX_AUTO_GAMMA + 1) -> ForwardCost:
    """T(1..max_tokens) for `model`, measured once (see the module note)."""
    key = cost_key(model)
    if key in _COSTS:
        return _COSTS[key]
    store = _store_path() if _persistent(model) else None
    if store is not None and store.exists():
        try:
            saved = json.loads(store.read_text()).get(key)
        except (OSError, ValueError):
            saved = None
        if saved and saved.get("contexts") == list(COST_CONTEXTS):
            _COSTS[key] = ForwardCost(tuple(map(tuple, saved["seconds"])), tuple(saved["contexts"]))
            return _COSTS[key]
    global calibration_seconds
    compiled_before, t0 = getattr(model, "compile_seconds", 0.0), time.perf_counter()
    cost = measure_forward_cost(model, max_tokens)
    # a one-time cost, like compiling (which the model counts itself)
    calibration_seconds += time.perf_counter() - t0 - (getattr(model, "compile_seconds", 0.0) - compiled_before)
    _COSTS[key] = cost
    if store is not None:
        try:
            data = json.loads(store.read_text()) if store.exists() else {}
        except (OSError, ValueError):
            data = {}
        data[key] = {"contexts": list(cost.contexts), "seconds": [list(r) for r in cost.seconds]}
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            store.write_text(json.dumps(data, indent=1))
        except OSError:  # a read-only home: the measurement is kept for this process only
            pass
    return cost


def measure_forward_cost(model: LanguageModel, max_tokens: int, contexts: tuple[int, ...] = COST_CONTEXTS,
                         repeats: int = 4) -> ForwardCost:
    """Median over `repeats` interleaved rounds of the seconds of a forward over k = 1..max_tokens tokens
    after each of `contexts` cached tokens (random token ids: the cost does not depend on which)."""
    if model.max_length is not None:  # toy models' short horizons
        contexts = tuple(sorted({max(1, min(c, model.max_length // 2)) for c in contexts}))
        max_tokens = max(1, min(max_tokens, model.max_length - contexts[-1]))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(model.vocab_size, (1, contexts[-1] + max_tokens), generator=gen).to(model.device)
    rows = []
    for context in contexts:
        cache = model.new_cache()
        model.forward(cache, ids[:, :context], logits_to_keep=1)
        for k in range(1, max_tokens + 1):  # warm-up: lazy initialisation, allocator, a compile per bucket
            model.forward(cache, ids[:, context : context + k], logits_to_keep=k)
            model.crop(cache, context)
        times: list[list[float]] = [[] for _ in range(max_tokens)]
        for _ in range(repeats):
            for k in range(1, max_tokens + 1):
                _sync(model)
                t0 = time.perf_counter()
                model.forward(cache, ids[:, context : context + k], logits_to_keep=k)
                _sync(model)
                times[k - 1].append(time.perf_counter() - t0)
                model.crop(cache, context)
        medians = [statistics.median(t) for t in times]
        # a longer forward never costs less; a noisy dip would make the controller prefer it
        rows.append(tuple(max(medians[: k + 1]) for k in range(len(medians))))
    return ForwardCost(tuple(rows), contexts)


def _persistent(model: LanguageModel) -> bool:
    from .models.hf import HFModel

    return isinstance(model, HFModel)


def _store_path():
    from .models.default import cache_dir

    return cache_dir() / "forward_cost.json"


def _sync(model: LanguageModel) -> None:
    if getattr(model.device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(model.device)


@dataclass
class Plan:
    option: Option | None  # None: no drafting this iteration
    length: int
    tokens: float  # expected tokens committed
    seconds: float  # predicted seconds (target forward + draft forwards)


@dataclass
class DraftLength:
    """The controller of `gamma=auto` (module note). `observe` after every verification."""
    target_cost: ForwardCost
    draft_cost: ForwardCost | None
    max_gamma: int = MAX_AUTO_GAMMA
    tries: dict[str, list[float]] = field(default_factory=dict)
    accepts: dict[str, list[float]] = field(default_factory=dict)

    def rates(self, key: str) -> list[float]:
        tries = self.tries.get(key, [0.0] * self.max_gamma)
        accepts = self.accepts.get(key, [0.0] * self.max_gamma)
        return [(a + PRIOR_ACCEPT) / (t + PRIOR_ACCEPT + PRIOR_REJECT) for a, t in zip(accepts, tries, strict=True)]

    def plan(self, options: list[Option], tokens: int, target_pending: int = 1) -> Plan:
        """The best option and length for a sequence of `tokens` tokens whose last `target_pending` the
        target has not cached yet. A draft model that lags (a copy drafted the last iterations) first feeds
        what it missed: its first forward covers those tokens. An available option whose first position has
        been tried fewer than EXPLORE times is tried with one draft first: without a record an option that
        costs more (the draft model) would never be chosen over one that costs nothing (a copy)."""
        best = Plan(None, 0, 1.0, self.target_cost(target_pending, tokens))
        for option in options:
            a = self.rates(option.key)
            catch_up = 0
            if option.runner is not None and self.draft_cost is not None:
                catch_up = max(1, tokens - option.runner.committed)
            survive, expected = 1.0, 1.0
            for g in range(1, min(option.length, self.max_gamma) + 1):
                survive *= a[g - 1]
                expected += survive
                seconds = self.target_cost(target_pending + g, tokens)
                if catch_up:
                    seconds += self.draft_cost(catch_up, tokens) + (g - 1) * self.draft_cost(1, tokens)
                if g == 1 and self.tries.get(option.key, [0.0])[0] < EXPLORE:
                    return Plan(option, 1, expected, seconds)
                if expected / seconds > best.tokens / best.seconds:
                    best = Plan(option, g, expected, seconds)
        return best

    def observe(self, key: str, drafted: int, accepted: int) -> None:
        tries = self.tries.setdefault(key, [0.0] * self.max_gamma)
        accepts = self.accepts.setdefault(key, [0.0] * self.max_gamma)
        for i in range(min(accepted + 1, drafted)):
            tries[i] += 1
        for i in range(accepted):
            accepts[i] += 1
