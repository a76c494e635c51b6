"""Exact small models: (non-stationary) Markov chains over a tiny vocabulary.

P(x_n = b | x_{n-1} = a) = transitions[n-1][a][b], positions counted from the first prompt token (0).
A [V, V] table is stationary. Because the next token depends only on the current one and its position,
the output at a query is log transitions[position][token], whatever the mask: the engine's tree and
cache bookkeeping is exercised, and exact sequence probabilities are available for the tests.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from ..warp import Sampling
from .base import LanguageModel


@dataclass
class MarkovCache:
    length: int = 0
    batch: int = 1


class MarkovLM(LanguageModel):
    def __init__(self, transitions, eos_token_id: int | None = None, name: str = "markov", hidden_size: int = 0):
        t = torch.as_tensor(transitions, dtype=torch.float64)
        if t.dim() not in (2, 3) or t.shape[-1] != t.shape[-2]:
            raise ValueError(f"transitions must have shape [T, V, V] or [V, V], got {tuple(t.shape)}")
        if (t < 0).any() or not torch.allclose(t.sum(-1), torch.ones((), dtype=t.dtype), atol=1e-9):
            raise ValueError("every row of transitions must be a probability distribution")
        self.stationary = t.dim() == 2
        self.transitions = t[None] if self.stationary else t
        self.vocab_size = t.shape[-1]
        # a non-stationary chain of horizon T defines tokens at positions 0..T
        self.max_length = None if self.stationary else self.transitions.shape[0] + 1
        self.eos_token_id = eos_token_id
        self.name = name
        self._log = self.transitions.log()
        # a stand-in for hidden states (`hidden_features`): a fixed random vector per layer, position and token
        self.hidden_size = hidden_size
        self._capture = threading.local()

    @contextlib.contextmanager
    def hidden_features(self, layers: tuple[int, ...]):
        """Within it, each forward appends to the yielded list one [B, n, hidden_size] tensor per layer in `layers`:
        a fixed random function of (layer, position, token), standing in for a network's hidden states
        (`models.features`)."""
        if not self.hidden_size:
            raise ValueError(f"{self.name} was made without hidden_size: it has no hidden states to expose")
        out: list[torch.Tensor] = []
        self._capture.layers, self._capture.out = tuple(layers), out
        try:
            yield out
        finally:
            self._capture.layers = None

    def _features(self, layer: int, step: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        tables = self.__dict__.setdefault("_tables", {})
        if layer not in tables:
            g = torch.Generator().manual_seed(1000 + layer)
            tables[layer] = torch.randn(self._log.shape[0], self.vocab_size, self.hidden_size, generator=g)
        return tables[layer][step, tokens]

    @property
    def token_counts(self) -> torch.Tensor:
        """A ranking of the tokens for a reduced draft vocabulary (`models.vocab`): how likely each is to come next,
        summed over every current token and position (scaled to integers)."""
        return (self.transitions.sum((0, 1)) * 1e6).round().long()

    def new_cache(self) -> MarkovCache:
        return MarkovCache()

    def forward(self, cache, tokens, positions=None, mask=None, logits_to_keep=0, fused_prefix=0, batch_invariant=True):
        b, n = tokens.shape
        if positions is None:
            positions = cache.length + torch.arange(n).expand(b, n)
        step = positions.clamp_max(self._log.shape[0] - 1) if self.stationary else positions
        if not self.stationary and int(positions.max()) >= self._log.shape[0]:
            raise ValueError(f"position {int(positions.max())} is past the chain's horizon {self._log.shape[0]}")
        logits = self._log[step, tokens]
        for layer in getattr(self._capture, "layers", None) or ():
            self._capture.out.append(self._features(layer, step, tokens))
        cache.length += n
        cache.batch = b
        return logits[:, -logits_to_keep:] if logits_to_keep else logits

    def crop(self, cache, length):
        cache.length = min(cache.length, length)

    def select_rows(self, cache, rows):
        cache.batch = len(rows)

    def keep_positions(self, cache, positions):
        cache.length = positions.shape[-1]

    # Exact distributions, for tests and the checker.
    def conditionals(self, position: int) -> torch.Tensor:
        """[V, V] table of P(next | current) for a current token at `position`."""
        return self.transitions[0 if self.stationary else position]

    def sequence_distribution(self, prompt: list[int], n: int, sampling: Sampling | None = None):
        """Exact law of the next n tokens after `prompt` under warped sampling.

        Returns (outcomes [V**n, n] LongTensor in lexicographic order, probabilities [V**n] float64).
        """
        sampling = sampling or Sampling()
        v = self.vocab_size
        outcomes = torch.tensor(list(itertools.product(range(v), repeat=n)), dtype=torch.long).reshape(-1, n)
        prob = torch.ones(len(outcomes), dtype=torch.float64)
        prev = torch.full((len(outcomes),), prompt[-1], dtype=torch.long)
        for i in range(n):
            table = sampling.probs(self._log[0 if self.stationary else len(prompt) - 1 + i])
            prob = prob * table[prev, outcomes[:, i]]
            prev = outcomes[:, i]
        return outcomes, prob


def random_markov_pair(vocab: int, horizon: int, seed: int, concentration: float = 1.0):
    """A (target, draft) pair of random non-stationary chains with Dirichlet(concentration) rows."""
    rng = np.random.default_rng(seed)

    def table():
        return rng.dirichlet(np.full(vocab, concentration), size=(horizon, vocab))

    return MarkovLM(table(), name="markov-target"), MarkovLM(table(), name="markov-draft")


@dataclass
class HistoryCache:
    tokens: torch.Tensor = field(default_factory=lambda: torch.empty(1, 0, dtype=torch.long))
    positions: torch.Tensor = field(default_factory=lambda: torch.empty(1, 0, dtype=torch.long))


class HistoryLM(LanguageModel):
    """An exact model whose next-token law depends on the whole prefix: a random Dirichlet row per
    distinct prefix, drawn from a seed and the prefix itself (so it is a fixed function of the prefix).

    Unlike `MarkovLM` it reads its context through the attention mask: a query sees exactly the cached
    and new tokens the mask allows, ordered by position. A wrong tree mask, position or cache compaction
    therefore changes its output, which makes it the exact model for testing trees and caches.
    """

    def __init__(
        self,
        vocab: int,
        seed: int = 0,
        concentration: float = 1.0,
        max_length: int = 16,
        name: str = "history",
        eos_token_id: int | None = None,
    ):
        self.vocab_size, self.seed, self.concentration = vocab, seed, concentration
        self.max_length, self.name, self.eos_token_id = max_length, name, eos_token_id
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}

    def row(self, prefix: tuple[int, ...]) -> torch.Tensor:
        """P(next | prefix), float64 [V]."""
        if prefix not in self._rows:
            rng = np.random.default_rng([self.seed, len(prefix), *prefix])
            self._rows[prefix] = torch.from_numpy(rng.dirichlet(np.full(self.vocab_size, self.concentration)))
        return self._rows[prefix]

    def new_cache(self) -> HistoryCache:
        return HistoryCache()

    def forward(self, cache, tokens, positions=None, mask=None, logits_to_keep=0, fused_prefix=0, batch_invariant=True):
        b, n = tokens.shape
        past = cache.tokens.shape[1]
        if cache.tokens.shape[0] != b:
            cache.tokens = cache.tokens.expand(b, -1)
            cache.positions = cache.positions.expand(b, -1)
        if positions is None:
            positions = past + torch.arange(n).expand(b, n)
        keys = torch.cat([cache.tokens, tokens], 1)
        key_pos = torch.cat([cache.positions, positions], 1)
        if mask is None:
            mask = torch.ones(n, past + n, dtype=torch.bool).tril(past).expand(b, n, past + n)
        out = torch.empty(b, n, self.vocab_size, dtype=torch.float64)
        for r in range(b):
            for i in range(n):
                seen = mask[r, i].nonzero().flatten()
                order = seen[torch.argsort(key_pos[r, seen])]
                if int(key_pos[r, order[-1]]) != int(positions[r, i]) or len(order) != int(positions[r, i]) + 1:
                    raise ValueError("a query must see one token at each position up to its own")
                out[r, i] = self.row(tuple(keys[r, order].tolist())).log()
        cache.tokens, cache.positions = keys, key_pos
        return out[:, -logits_to_keep:] if logits_to_keep else out

    def crop(self, cache, length):
        cache.tokens, cache.positions = cache.tokens[:, :length], cache.positions[:, :length]

    def select_rows(self, cache, rows):
        cache.tokens, cache.positions = cache.tokens[rows], cache.positions[rows]

    def keep_positions(self, cache, positions):
        if positions.dim() == 2:  # one list per row
            rows = positions.shape[0]
            cache.tokens = cache.tokens.expand(rows, -1).gather(1, positions)
            cache.positions = cache.positions.expand(rows, -1).gather(1, positions)
        else:
            cache.tokens, cache.positions = cache.tokens[:, positions], cache.positions[:, positions]

    def sequence_distribution(self, prompt: list[int], n: int, sampling: Sampling | None = None):
        sampling = sampling or Sampling()
        outcomes = torch.tensor(list(itertools.product(range(self.vocab_size), repeat=n)), dtype=torch.long)
        prob = torch.ones(len(outcomes), dtype=torch.float64)
        for k, seq in enumerate(outcomes.tolist()):
            ctx = tuple(prompt)
            for tok in seq:
                prob[k] *= sampling.probs(self.row(ctx).log())[tok]
                ctx = ctx + (tok,)
        return outcomes.reshape(-1, n), prob


def random_history_pair(vocab: int, seed: int, concentration: float = 1.0, max_length: int = 16):
    return (
        HistoryLM(vocab, seed * 2, concentration, max_length, name="history-target"),
        HistoryLM(vocab, seed * 2 + 1, concentration, max_length, name="history-draft"),
    )
