"""Draft length that pays: a cost curve of the target's forward and the acceptance seen so far.

`forward_cost(model)` measures T(k), the seconds of one forward over k new tokens on a cache of a typical
length, once per model, dtype, device and thread count (a few seconds; kept in memory and, for Hugging Face
models, in the cache folder). `DraftLength` keeps, per drafter key (the draft model, or a copying drafter
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
COST_CONTEXT = 256  # cached tokens while measuring
# the acceptance prior: a Beta(PRIOR_ACCEPT, PRIOR_REJECT) per position, so that a drafter is tried before
# its record speaks
PRIOR_ACCEPT, PRIOR_REJECT = 1.0, 1.0


@dataclass(frozen=True)
class ForwardCost:
    """seconds[k - 1]: one forward over k new tokens; beyond the measured range, linear extrapolation."""
    seconds: tuple[float, ...]

    def __call__(self, k: int) -> float:
        if k <= 0:
            return 0.0
        s = self.seconds
        if k <= len(s):
            return s[k - 1]
        slope = max(s[-1] - s[-2], 0.0) if len(s) > 1 else s[-1]
        return s[-1] + slope * (k - len(s))


_COSTS: dict[str, ForwardCost] = {}


def cost_key(model: LanguageModel) -> str:
    dtype = getattr(model, "dtype", None)
    return f"{model.name}|{dtype}|{model.device}|threads={torch.get_num_threads()}|torch={torch.__version__}"


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
        if saved and len(saved) >= max_tokens:
            _COSTS[key] = ForwardCost(tuple(saved))
            return _COSTS[key]
    cost = measure_forward_cost(model, max_tokens)
    _COSTS[key] = cost
    if store is not None:
        try:
            data = json.loads(store.read_text()) if store.exists() else {}
        except (OSError, ValueError):
            data = {}
        data[key] = list(cost.seconds)
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            store.write_text(json.dumps(data, indent=1))
        except OSError:  # a read-only home: the measurement is kept for this process only
            pass
    return cost


def measure_forward_cost(model: LanguageModel, max_tokens: int, context: int = COST_CONTEXT,
                         repeats: int = 5) -> ForwardCost:
    """Median over `repeats` interleaved rounds of the seconds of a forward over k = 1..max_tokens tokens
    after `context` cached ones (random token ids: the cost does not depend on which)."""
    if model.max_length is not None and context + max_tokens > model.max_length:  # toy models' short horizons
        context = max(1, model.max_length // 2)
        max_tokens = max(1, min(max_tokens, model.max_length - context))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(model.vocab_size, (1, context + max_tokens), generator=gen).to(model.device)
    cache = model.new_cache()
    model.forward(cache, ids[:, :context], logits_to_keep=1)
    for k in (1, max_tokens):  # warm-up: lazy initialisation and allocator
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
    return ForwardCost(tuple(max(medians[: k + 1]) for k in range(len(medians))))


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

    def plan(self, options: list[Option]) -> Plan:
        best = Plan(None, 0, 1.0, self.target_cost(1))
        for option in options:
            a = self.rates(option.key)
            survive, tokens = 1.0, 1.0
            for g in range(1, min(option.length, self.max_gamma) + 1):
                survive *= a[g - 1]
                tokens += survive
                seconds = self.target_cost(g + 1) + (g * self.draft_cost(1) if option.runner is not None
                                                     and self.draft_cost is not None else 0.0)
                if tokens / seconds > best.tokens / best.seconds:
                    best = Plan(option, g, tokens, seconds)
        return best

    def observe(self, key: str, drafted: int, accepted: int) -> None:
        tries = self.tries.setdefault(key, [0.0] * self.max_gamma)
        accepts = self.accepts.setdefault(key, [0.0] * self.max_gamma)
        for i in range(min(accepted + 1, drafted)):
            tries[i] += 1
        for i in range(accepted):
            accepts[i] += 1
