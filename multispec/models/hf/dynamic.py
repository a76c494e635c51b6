"""transformers' own `DynamicCache`, for the families whose attention layers do not go through transformers'
attention interface (so cannot write our static cache): uncompiled, one forward at a time, with the same
operations on the cache (crop, select rows, keep positions) as the static one."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .model import HFModel


class DynamicSteps:
    """The cache operations and forward of an `HFModel` that keeps transformers' dynamic cache (`HFModel.dynamic`)."""

    def __init__(self, hf: HFModel):
        self.hf = hf

    def new_cache(self):
        from transformers import DynamicCache

        if self.hf.sliding_window:
            # full-length layers: trees and commits index every position, so sliding layers must not drop
            # old entries; the window is applied through the mask. `key_positions`: each entry's position id
            cache = DynamicCache()
            cache.key_positions = torch.empty(1, 0, dtype=torch.long, device=self.hf.device)
            return cache
        return DynamicCache(config=self.hf.model.config)

    def crop(self, cache, length: int) -> None:
        if self.hf.sliding_window:
            cache.key_positions = cache.key_positions[:, :length]
        for layer in cache.layers:
            if layer.is_initialized and layer.keys.shape[-2] > length:
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]

    def select_rows(self, cache, rows: torch.Tensor) -> None:
        rows = rows.to(self.hf.device)
        if self.hf.sliding_window:
            cache.key_positions = cache.key_positions.expand(int(rows.max()) + 1, -1)[rows]
        for layer in cache.layers:
            if layer.is_initialized:
                layer.keys = layer.keys.index_select(0, rows)
                layer.values = layer.values.index_select(0, rows)

    def keep_positions(self, cache, positions: torch.Tensor) -> None:
        positions = positions.to(self.hf.device)
        per_row = positions.dim() == 2
        if self.hf.sliding_window:
            kp = cache.key_positions
            cache.key_positions = (
                kp.expand(positions.shape[0], -1).gather(1, positions) if per_row else kp[:, positions]
            )
        for layer in cache.layers:
            if not layer.is_initialized:
                continue
            if per_row:  # keys [B, heads, L, d]: row b keeps positions[b]
                index = positions[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
                layer.keys = layer.keys.gather(2, index)
                layer.values = layer.values.gather(2, index)
            else:
                layer.keys = layer.keys.index_select(-2, positions)
                layer.values = layer.values.index_select(-2, positions)

    def forward(self, cache, tokens, positions=None, mask=None, logits_to_keep=0):
        kwargs = {}
        if positions is not None:
            kwargs["position_ids"] = positions.to(self.hf.device)
        if self.hf.sliding_window:
            b, n = tokens.shape
            past = cache.key_positions.shape[1]
            new = (
                positions.to(self.hf.device)
                if positions is not None
                else torch.arange(past, past + n, device=self.hf.device).expand(b, n)
            )
            keys = torch.cat([cache.key_positions.expand(b, -1), new.expand(b, -1)], 1)
            cache.key_positions = keys
        if mask is not None:
            mask = mask.to(self.hf.device)
            kwargs["attention_mask"] = self._additive(mask)
            if self.hf.sliding_window:  # a key is in the window when its position is within `window` of the query's
                windowed = self._additive(mask & (keys[:, None, :] > new[:, :, None] - self.hf.sliding_window))
                kwargs["attention_mask"] = (
                    {"full_attention": kwargs["attention_mask"], "sliding_attention": windowed}
                    if self.hf.mixed_layers
                    else windowed
                )
        out = self.hf.model(
            input_ids=tokens.to(self.hf.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )
        return out.logits[..., : self.hf.vocab_size].float()

    def _additive(self, mask: torch.Tensor) -> torch.Tensor:
        """bool [B, n, K] -> additive [B, 1, n, K]: 0 where allowed, the dtype's minimum elsewhere."""
        additive = torch.zeros(mask.shape, dtype=self.hf.dtype, device=self.hf.device)
        additive.masked_fill_(~mask, torch.finfo(self.hf.dtype).min)
        return additive[:, None]
