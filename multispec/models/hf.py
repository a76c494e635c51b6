"""Any transformers causal LM behind the `LanguageModel` interface.

Trees and beams pass a boolean [B, n, past + n] mask; it is handed to the model as an additive 4-D mask
([B, 1, n, past + n], 0 where allowed and the dtype's minimum elsewhere) together with explicit
position ids, which transformers uses as given. Chains pass no mask and get the model's own causal path.

On a CPU, the float32 linear layers are switched to `FewRowsLinear` (`models/kernels.py`).
"""

from __future__ import annotations

from typing import Any

import torch

from .base import LanguageModel
from .kernels import use_few_rows_linears


class HFModel(LanguageModel):
    def __init__(self, model, tokenizer=None, name: str | None = None, chat: bool = True):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "name_or_path", None) or type(model).__name__
        cfg = model.config
        table = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else cfg.vocab_size
        # the embedding table may be padded past the tokenizer's vocabulary: only the tokenizer's ids are real
        self.vocab_size = min(len(tokenizer), table) if tokenizer is not None else table
        self.max_length = getattr(cfg, "max_position_embeddings", None)
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos is None and tokenizer is not None:
            eos = tokenizer.eos_token_id
        eos = [e for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]
        self.eos_token_id = eos[0] if eos else None
        self.stop_token_ids = tuple(int(e) for e in eos)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.use_chat_template = chat
        # sliding-window attention (Mistral, Gemma 2/3, ...): a custom mask replaces the model's own, so the
        # window is applied here; `mixed`: some layers slide and others attend to everything
        window = getattr(cfg, "sliding_window", None)
        self.sliding_window = window if window and getattr(cfg, "use_sliding_window", True) is not False else None
        kinds = set(getattr(cfg, "layer_types", None) or [])
        if self.sliding_window and kinds and "sliding_attention" not in kinds:
            self.sliding_window = None
        self.mixed_layers = bool(self.sliding_window) and len(kinds) > 1
        if self.device.type == "cpu":
            use_few_rows_linears(model)

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype: torch.dtype | str = "auto", device: str | None = None, **kwargs):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        except (OSError, ValueError):  # no usable tokenizer files: ids-only use is still possible
            tokenizer = None
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **kwargs)
        if device is not None:
            model = model.to(device)
        return cls(model, tokenizer, name=str(name_or_path))

    # -- cache ---------------------------------------------------------------------------------
    def new_cache(self) -> Any:
        from transformers import DynamicCache

        if self.sliding_window:
            # full-length layers: trees and commits index every position, so sliding layers must not drop
            # old entries; the window is applied through the mask instead. `key_positions` tracks the
            # position id of every cached entry for that mask.
            cache = DynamicCache()
            cache.key_positions = torch.empty(1, 0, dtype=torch.long, device=self.device)
            return cache
        return DynamicCache(config=self.model.config)


    def crop(self, cache, length: int) -> None:
        if self.sliding_window:
            cache.key_positions = cache.key_positions[:, :length]
        for layer in cache.layers:
            if layer.is_initialized and layer.keys.shape[-2] > length:
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]

    def select_rows(self, cache, rows: torch.Tensor) -> None:
        rows = rows.to(self.device)
        if self.sliding_window:
            cache.key_positions = cache.key_positions.expand(int(rows.max()) + 1, -1)[rows]
        for layer in cache.layers:
            if layer.is_initialized:
                layer.keys = layer.keys.index_select(0, rows)
                layer.values = layer.values.index_select(0, rows)

    def keep_positions(self, cache, positions: torch.Tensor) -> None:
        positions = positions.to(self.device)
        per_row = positions.dim() == 2
        if self.sliding_window:
            kp = cache.key_positions
            cache.key_positions = (kp.expand(positions.shape[0], -1).gather(1, positions) if per_row
                                   else kp[:, positions])
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

    # -- scoring -------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, cache, tokens, positions=None, mask=None, logits_to_keep=0):
        kwargs = {}
        if positions is not None:
            kwargs["position_ids"] = positions.to(self.device)
        if self.sliding_window:
            b, n = tokens.shape
            past = cache.key_positions.shape[1]
            new = (positions.to(self.device) if positions is not None
                   else torch.arange(past, past + n, device=self.device).expand(b, n))
            keys = torch.cat([cache.key_positions.expand(b, -1), new.expand(b, -1)], 1)
            cache.key_positions = keys
        if mask is not None:
            mask = mask.to(self.device)
            kwargs["attention_mask"] = self._additive(mask)
            if self.sliding_window:  # a key is in the window when its position is within `window` of the query's
                windowed = self._additive(mask & (keys[:, None, :] > new[:, :, None] - self.sliding_window))
                kwargs["attention_mask"] = ({"full_attention": kwargs["attention_mask"], "sliding_attention": windowed}
                                            if self.mixed_layers else windowed)
        out = self.model(
            input_ids=tokens.to(self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )
        return out.logits[..., : self.vocab_size].float()

    def _additive(self, mask: torch.Tensor) -> torch.Tensor:
        """bool [B, n, K] -> additive [B, 1, n, K]: 0 where allowed, the dtype's minimum elsewhere."""
        additive = torch.zeros(mask.shape, dtype=self.dtype, device=self.device)
        additive.masked_fill_(~mask, torch.finfo(self.dtype).min)
        return additive[:, None]

    # -- text ----------------------------------------------------------------------------------
    def encode(self, text: str, chat: bool = True) -> list[int]:
        if self.tokenizer is None:
            return super().encode(text, chat)
        if chat and self.use_chat_template and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if hasattr(ids, "keys"):  # newer transformers return a BatchEncoding
                ids = ids["input_ids"]
            return list(ids)
        return self.tokenizer(text)["input_ids"]

    def decode(self, ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(ids, skip_special_tokens=True)
