"""A target that keeps the hidden states it computes, for a draft that drafts from them (`models.eagle`).

A feature-level draft head (EAGLE-3) reads, for every committed token, the target's hidden states at a few of its
layers. The target computes them anyway in the forward that scores the token; `FeatureTarget` keeps them beside the
KV cache, one feature vector per cache entry, and applies every cache operation (crop, row selection, kept
positions) to both. So after each commit the features of exactly the committed, cached tokens remain: no second
forward and no bookkeeping in the methods.

A backend exposes its hidden states through `hidden_features(layers)`: a context manager that yields a list, to
which each forward inside it appends one tensor per layer, [B, width, H] (width >= the tokens fed: padding last),
holding the input of that layer (the residual stream before it). `HFModel` does it with forward pre-hooks on its
decoder layers (eager steps), or with packaged compiled steps whose graph returns them beside the logits;
`MarkovLM` can carry a fixed random feature per (position, token), for the exactness checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .base import LanguageModel


@dataclass
class FeatureCache:
    """The target's own cache and the features of its entries."""

    inner: Any
    features: torch.Tensor | None = None  # [B, L, F]: entry i's features (L: the entries cached)

    @property
    def length(self) -> int:
        return 0 if self.features is None else self.features.shape[1]


class FeatureTarget(LanguageModel):
    """`target`, keeping the hidden states of `layers` (their inputs, concatenated: F = len(layers) x hidden) for
    every cached entry (module note)."""

    def __init__(self, target: LanguageModel, layers: tuple[int, ...]):
        if not hasattr(target, "hidden_features"):
            raise ValueError(f"{target.name} does not expose its hidden states: a feature-level draft cannot read it")
        self.target, self.layers = target, tuple(layers)
        self.vocab_size = target.vocab_size
        self.max_length = target.max_length
        self.eos_token_id = target.eos_token_id
        self.stop_token_ids = target.stop_token_ids
        self.tokenizer = target.tokenizer
        self.device = target.device
        self.name = target.name

    def __getattr__(self, attr: str) -> Any:
        # what the engine reads of a backend beyond the interface (dtype, compile, padded_tokens, ...)
        if attr in ("target", "layers"):
            raise AttributeError(attr)
        return getattr(self.target, attr)

    def new_cache(self) -> FeatureCache:
        inner = self.target.new_cache()
        # the hidden states are read by hooks on eager steps, and returned by packaged compiled ones (`HFModel`); a
        # CUDA graph would need its own outputs for them: this cache's steps are not captured
        if hasattr(inner, "captured"):
            inner.captured = False
        return FeatureCache(inner)

    def prepare(self) -> None:
        self.target.prepare()

    def forward(self, cache, tokens, positions=None, mask=None, logits_to_keep=0, fused_prefix=0, batch_invariant=True):
        n = tokens.shape[1]
        with self.target.hidden_features(self.layers) as seen:
            logits = self.target.forward(
                cache.inner, tokens, positions, mask, logits_to_keep, fused_prefix, batch_invariant
            )
        if len(seen) != len(self.layers):
            raise RuntimeError(f"{self.name}: {len(seen)} hidden states seen in a forward, {len(self.layers)} expected")
        new = torch.cat([h[:, :n] for h in seen], -1).detach()
        cache.features = new if cache.features is None else torch.cat([cache.features, new.to(cache.features)], 1)
        return logits

    def crop(self, cache, length: int) -> None:
        self.target.crop(cache.inner, length)
        if cache.features is not None:
            cache.features = cache.features[:, :length]

    def select_rows(self, cache, rows: torch.Tensor) -> None:
        self.target.select_rows(cache.inner, rows)
        if cache.features is not None:
            cache.features = cache.features[rows.to(cache.features.device)]

    def keep_positions(self, cache, positions: torch.Tensor) -> None:
        self.target.keep_positions(cache.inner, positions)
        if cache.features is not None:
            index = positions.to(cache.features.device)
            if index.dim() == 1:
                cache.features = cache.features[:, index]
            else:
                cache.features = cache.features.gather(1, index[..., None].expand(-1, -1, cache.features.shape[-1]))

    def encode(self, text: str, chat: bool = True) -> list[int]:
        return self.target.encode(text, chat)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.target.encode_chat(messages)

    def decode(self, ids: list[int]) -> str | None:
        return self.target.decode(ids)
