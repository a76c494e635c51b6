"""Any transformers causal LM behind the `LanguageModel` interface.

Trees and beams pass a boolean [B, n, past + n] mask; it is handed to the model as an additive 4-D mask
([B, 1, n, past + n], 0 where allowed and the dtype's minimum elsewhere) together with explicit
position ids, which transformers uses as given. Chains pass no mask and get the model's own causal path.

On a CPU the output head of plain Llama-style models is computed here rather than by the model: MKL
multiplies the [vocabulary x width] head by the few hidden states of a decoding step far faster as
`head @ states.T` than as `states @ head.T` (measured on this project's 2-core machine, SmolLM2's
49152 x 576 head: 3.5 ms instead of 24 ms for two positions, and, with one position padded to two,
3.5 ms instead of 10 ms). Speculative steps score 2 to 9 positions, where the slow path hurt most.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import LanguageModel


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
        self.eos_token_id = eos[0] if isinstance(eos, (list, tuple)) else eos
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.use_chat_template = chat
        self._fast_head = _cpu_head_weight(model)

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

        return DynamicCache(config=self.model.config)

    def cache_length(self, cache) -> int:
        return cache.get_seq_length()

    def crop(self, cache, length: int) -> None:
        for layer in cache.layers:
            if layer.is_initialized and layer.keys.shape[-2] > length:
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]

    def select_rows(self, cache, rows: torch.Tensor) -> None:
        rows = rows.to(self.device)
        for layer in cache.layers:
            if layer.is_initialized:
                layer.keys = layer.keys.index_select(0, rows)
                layer.values = layer.values.index_select(0, rows)

    def keep_positions(self, cache, positions: torch.Tensor) -> None:
        positions = positions.to(self.device)
        for layer in cache.layers:
            if layer.is_initialized:
                layer.keys = layer.keys.index_select(-2, positions)
                layer.values = layer.values.index_select(-2, positions)

    # -- scoring -------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, cache, tokens, positions=None, mask=None, logits_to_keep=0):
        kwargs = {}
        if positions is not None:
            kwargs["position_ids"] = positions.to(self.device)
        if mask is not None:
            additive = torch.zeros(mask.shape, dtype=self.dtype, device=self.device)
            additive.masked_fill_(~mask.to(self.device), torch.finfo(self.dtype).min)
            kwargs["attention_mask"] = additive[:, None]
        if self._fast_head is None or self.device.type != "cpu":
            out = self.model(
                input_ids=tokens.to(self.device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
                **kwargs,
            )
            return out.logits[..., : self.vocab_size].float()
        hidden = self.model.base_model(input_ids=tokens.to(self.device), past_key_values=cache, use_cache=True,
                                       **kwargs).last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return _head_logits(self._fast_head[: self.vocab_size], hidden)

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


# model types whose logits are exactly lm_head(final hidden state): no bias, scale or soft-capping
_PLAIN_HEAD_TYPES = {"llama", "mistral", "qwen2", "qwen3"}


def _cpu_head_weight(model) -> torch.Tensor | None:
    """The head's weight where `_head_logits` may stand in for the model's own head, else None."""
    cfg = model.config
    head = model.get_output_embeddings()
    if (getattr(cfg, "model_type", None) not in _PLAIN_HEAD_TYPES or not isinstance(head, torch.nn.Linear)
            or head.bias is not None or head.weight.dtype != torch.float32
            or getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None)):
        return None
    return head.weight


def _head_logits(weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [B, T, H] @ weight.T as weight @ hidden.T (see the module note), float32 [B, T, V]."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    n = flat.shape[0]
    if n == 1:  # a matrix-vector product takes MKL's slower path: pad to two columns
        flat = torch.cat([flat, flat])
    logits = (weight @ flat.T).T[:n].contiguous()
    return logits.reshape(*hidden.shape[:-1], weight.shape[0])
