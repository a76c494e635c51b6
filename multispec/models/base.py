"""The one small interface every model backend implements.

A backend scores new tokens on top of a KV cache: `forward(cache, tokens, positions, mask)` appends the
tokens' entries to the cache and returns their next-token logits. Trees and beams need explicit
positions and a mask over (cached + new) keys; chains need neither. The cache operations are what the
engine uses to commit: crop to a length, select or reorder batch rows, keep a chosen set of positions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch


class LanguageModel(ABC):
    #: usable vocabulary (the tokenizer's size; logits are cut to it when the embedding table is padded)
    vocab_size: int
    #: longest sequence (prompt + generated) the model accepts, or None when unbounded
    max_length: int | None = None
    eos_token_id: int | None = None
    #: every token that ends a generation (a chat model may end turns with one and text with another);
    #: empty: the eos_token_id alone, if any
    stop_token_ids: tuple[int, ...] = ()
    tokenizer: Any = None
    name: str = "model"
    device: torch.device = torch.device("cpu")

    @property
    def stop_tokens(self) -> frozenset[int]:
        ids = set(self.stop_token_ids)
        if self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        return frozenset(ids)

    @abstractmethod
    def new_cache(self) -> Any:
        """An empty cache."""

    def prepare(self) -> None:
        """Settle, before a cache is made for batch-invariant scoring (a target's), whatever the cache depends on
        (a backend's kernels, say). Nothing by default."""
        return None

    @abstractmethod
    def forward(
        self,
        cache: Any,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        fused_prefix: int = 0,
        batch_invariant: bool = True,
    ) -> torch.Tensor:
        """Score `tokens` after the cached ones; the cache grows by n.

        Args:
            cache: this model's cache (`new_cache`), B rows of the same length.
            tokens: [B, n] the new tokens.
            positions: [B, n] position ids (default: cache length + 0..n-1).
            mask: bool [B, n, cache length + n], True where a new token may attend (default: causal).
            logits_to_keep: return logits for only the last k new tokens (0: all).
            fused_prefix: into an empty cache, the first k tokens are a prompt's, which attend causally among
                themselves and whose logits are not kept: a backend may attend them with a faster kernel whose
                last bits differ from its steps' (the engine feeds every method's prompt alike, so all meet the
                same cache).
            batch_invariant: False where a token's logits may depend on the other tokens scored with it (a
                draft's: only the target's logits decide the output), so a backend may skip what it pays for
                invariance.

        Returns:
            Float logits [B, k or n, vocab_size] (float32 at least).
        """

    @abstractmethod
    def crop(self, cache: Any, length: int) -> None:
        """Keep the first `length` positions."""

    @abstractmethod
    def select_rows(self, cache: Any, rows: torch.Tensor) -> None:
        """Keep / reorder / repeat batch rows: row i of the new cache is row rows[i] of the old."""

    @abstractmethod
    def keep_positions(self, cache: Any, positions: torch.Tensor) -> None:
        """Keep only the given sequence positions, in the given order: [L] the same for every row, or
        [B, L] one list per row."""

    # Text, for backends with a tokenizer.
    def encode(self, text: str, chat: bool = True) -> list[int]:
        raise ValueError(f"{self.name} has no tokenizer: give the prompt as a list of token ids")

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """A conversation (`[{"role": ..., "content": ...}, ...]`) through the tokenizer's chat template, ready
        for the assistant's turn."""
        raise ValueError(f"{self.name} has no tokenizer, so no chat template: give the prompt as token ids")

    def decode(self, ids: list[int]) -> str | None:
        return None


class ModelView(LanguageModel):
    """A model seen through a stand-in (a batch's row of it): everything is the model's (`_model`), its names,
    vocabulary, costs and cache operations; a subclass overrides what it sees otherwise (its cache, its forwards)."""

    def __init__(self, model: LanguageModel):
        self._model = model
        # what `LanguageModel` gives defaults for is read from the model, not the defaults
        for name in ("vocab_size", "max_length", "eos_token_id", "stop_token_ids", "tokenizer", "name", "device"):
            setattr(self, name, getattr(model, name))

    def __getattr__(self, name):
        if name == "_model":  # (not set yet: no recursion)
            raise AttributeError(name)
        return getattr(self._model, name)

    @property
    def stop_tokens(self) -> frozenset[int]:
        return self._model.stop_tokens

    def new_cache(self) -> Any:
        return self._model.new_cache()

    def forward(self, cache, *args, **kwargs) -> torch.Tensor:
        return self._model.forward(cache, *args, **kwargs)

    def crop(self, cache, length: int) -> None:
        self._model.crop(cache, length)

    def select_rows(self, cache, rows: torch.Tensor) -> None:
        self._model.select_rows(cache, rows)

    def keep_positions(self, cache, positions: torch.Tensor) -> None:
        self._model.keep_positions(cache, positions)

    def decode(self, ids: list[int]) -> str | None:
        return self._model.decode(ids)
