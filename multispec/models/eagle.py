"""Feature-level draft heads (EAGLE-3): a draft that reads the target's own hidden states.

The head is one decoder layer. For the token at position p it reads the token's embedding and a feature vector: the
target's hidden states after token p - 1 (the inputs of three of its layers, low, middle and high, concatenated and
mapped to the head's width by `fc`), when the target has scored that token; else the head's own output after token
p - 1 (its prediction of that feature: how it drafts several tokens ahead). Its output goes through a norm and a
head over its own draft vocabulary (`d2t` maps a draft id to a target id), and its logits are widened to the target's
vocabulary with -inf elsewhere: tokens outside the draft vocabulary have draft probability 0, which every rule
handles exactly (the residual supplies them).

`EagleDraft` puts a head behind the ordinary model interface, so every drafter and method that runs a draft model
runs it. Its cache keeps, per entry, the head's keys and values and its output feature. The target's features come
from a `FeatureTarget` (`models.features`), which a `Session` wraps around the target when its draft reads features
(`reads_target_features`) and attaches to the head's cache (`attach`). A proposal's drafts were fed with the head's
own features; the drafter drops them at the verdict, and the accepted tokens are fed again with the target's.

The layout is the `speculators` one that vLLM and SGLang read (`config.json` with `speculators_model_type`
"eagle3" and a `transformer_layer_config`; weights `fc`, `layers.0.*` with `hidden_norm`, `norm`, `lm_head`,
`d2t`, `t2d`, and `embed_tokens` unless it is the target's), and the original EAGLE-3 one (`midlayer.*`):
`load_eagle`, `save_eagle`.
"""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .base import LanguageModel

CONFIG = "config.json"
WEIGHTS = "model.safetensors"


def default_layers(target_layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs a head reads when its config names none: low, middle, high (EAGLE-3's)."""
    return (min(2, target_layers - 1), target_layers // 2, max(0, target_layers - 3))


@dataclass
class HeadConfig:
    """A head's shape. `layer` is the decoder layer's transformers config (a `LlamaConfig`: width, heads, rope)."""

    layer: Any
    target_hidden: int  # the target's hidden size (each of the features read)
    draft_vocab: int  # rows of the head's output
    target_layers: tuple[int, ...]  # the target layers whose inputs are read
    norm_before_residual: bool = True  # (vLLM's reading of a config that does not say)
    norm_before_fc: bool = False  # one RMSNorm over the concatenated features before `fc` (`input_norm`)
    norm_output: bool = False  # the head's normed output, not its residual stream, is fed back (EAGLE 3.1)
    extra: dict = field(default_factory=dict)  # other keys of the file's config, written back as they were

    @property
    def hidden(self) -> int:
        return self.layer.hidden_size


class HeadLayer(nn.Module):
    """EAGLE-3's decoder layer: attention over [normed embedding, normed feature] (2 x hidden wide), then an MLP."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        c = cfg.layer
        h, heads, kv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or h // heads
        self.heads, self.kv_heads = heads, kv
        self.norm_before_residual = cfg.norm_before_residual
        bias = bool(getattr(c, "attention_bias", False))
        self.input_layernorm = LlamaRMSNorm(h, eps=c.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=c.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=c.rms_norm_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * h, heads * self.head_dim, bias=bias)
        self.self_attn.k_proj = nn.Linear(2 * h, kv * self.head_dim, bias=bias)
        self.self_attn.v_proj = nn.Linear(2 * h, kv * self.head_dim, bias=bias)
        self.self_attn.o_proj = nn.Linear(heads * self.head_dim, h, bias=bias)
        self.mlp = LlamaMLP(c)


class EagleHead(nn.Module):
    """The head's weights (names as in the speculators layout) and its forward over given keys and values."""

    def __init__(self, cfg: HeadConfig, embed: nn.Embedding | None = None):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.cfg = cfg
        h = cfg.hidden
        wide = len(cfg.target_layers) * cfg.target_hidden
        self.input_norm = LlamaRMSNorm(wide, eps=cfg.layer.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc = nn.Linear(wide, h, bias=False)
        self.layers = nn.ModuleList([HeadLayer(cfg)])
        self.norm = LlamaRMSNorm(h, eps=cfg.layer.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab, bias=False)
        # draft id d is target id d + d2t[d]
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab, dtype=torch.long))
        # the target's embedding table, shared (not a parameter of the head: not trained, saved or converted), or
        # the head's own
        self.shared_embed = (embed,) if embed is not None else ()
        if embed is None:
            self.embed_tokens = nn.Embedding(cfg.layer.vocab_size, h)
        self.rotary = LlamaRotaryEmbedding(cfg.layer)

    @property
    def layer(self) -> HeadLayer:
        return self.layers[0]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return (self.shared_embed[0] if self.shared_embed else self.embed_tokens)(tokens)

    @property
    def embedded_tokens(self) -> int:
        return (self.shared_embed[0] if self.shared_embed else self.embed_tokens).num_embeddings

    def read_target(self, features: torch.Tensor) -> torch.Tensor:
        """The target's concatenated features [..., n x target_hidden] -> the head's input features [..., hidden]."""
        return self.fc(features if self.input_norm is None else self.input_norm(features))

    def target_ids(self) -> torch.Tensor:
        """[draft_vocab] the target id of each draft id."""
        return torch.arange(self.cfg.draft_vocab, device=self.d2t.device) + self.d2t

    def logits_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., draft_vocab] of the head's output features [..., hidden] (`step`'s first)."""
        return self.lm_head(hidden if self.cfg.norm_output else self.norm(hidden))

    def step(self, tokens, features, positions, keys, values, mask, logits: bool = True):
        """One pass of the layer.

        Args:
            tokens: [B, n] target ids.
            features: [B, n, hidden] each token's input feature (already through `fc` where it is the target's).
            positions: [B, n] rope positions.
            keys, values: [B, K, kv_heads, head_dim] the cached entries' (K may be 0).
            mask: bool [B, n, K + n], True where a new token may attend.
            logits: False: no logits (None; `logits_of` makes them for the positions that need them).

        Returns:
            (output features [B, n, hidden]: what a child reads (before the final norm, unless `norm_output`),
            logits [B, n, draft_vocab], the new keys and values [B, n, kv_heads, head_dim]).
        """
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        layer, b, n = self.layer, tokens.shape[0], tokens.shape[1]
        embeds = self.embed(tokens).to(features.dtype)
        normed = layer.hidden_norm(features)
        residual = normed if layer.norm_before_residual else features
        x = torch.cat([layer.input_layernorm(embeds), normed], -1)
        attn, hd = layer.self_attn, layer.head_dim
        q = attn.q_proj(x).view(b, n, layer.heads, hd).transpose(1, 2)
        k = attn.k_proj(x).view(b, n, layer.kv_heads, hd).transpose(1, 2)
        v = attn.v_proj(x).view(b, n, layer.kv_heads, hd)
        cos, sin = self.rotary(x, positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = k.transpose(1, 2)
        all_k = torch.cat([keys.to(k.dtype), k], 1).transpose(1, 2)
        all_v = torch.cat([values.to(v.dtype), v], 1).transpose(1, 2)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, all_k, all_v, attn_mask=mask[:, None], enable_gqa=layer.heads != layer.kv_heads
        )
        hidden = residual + attn.o_proj(out.transpose(1, 2).reshape(b, n, -1))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        out = self.norm(hidden) if self.cfg.norm_output else hidden
        return out, self.logits_of(out) if logits else None, k, v


@dataclass
class EagleCache:
    """A head's cache: per entry its key and value, output feature and position, in buffers with room past `length`
    (entries from `length` on are free): keys [B, kv_heads, C, head_dim], values [B, kv_heads, C, head_dim + 1] (a
    column of ones past the values: the layout `dpbf16.attend_tokens` reads), out [B, C, hidden], positions [B, C]."""

    keys: torch.Tensor
    values: torch.Tensor
    out: torch.Tensor
    positions: torch.Tensor
    length: int = 0
    source: Any = None  # the target's `FeatureCache` (`EagleDraft.attach`)

    @property
    def rows(self) -> int:
        return self.keys.shape[0]

    def reserve(self, needed: int, rows: int | None = None) -> None:
        """Room for `needed` entries (capacity doubled) and, on an empty cache, `rows` rows."""
        rows = rows or self.rows
        if needed <= self.keys.shape[2] and rows == self.rows:
            return
        capacity = max(self.keys.shape[2], 64)
        while capacity < needed:
            capacity *= 2
        n = self.length
        old = (self.keys, self.values, self.out, self.positions)
        k, v = old[0], old[1]
        self.keys = k.new_zeros(rows, k.shape[1], capacity, k.shape[3])
        self.values = v.new_ones(rows, v.shape[1], capacity, v.shape[3])
        self.out = old[2].new_zeros(rows, capacity, old[2].shape[2])
        self.positions = old[3].new_zeros(rows, capacity)
        if n:
            self.keys[:, :, :n], self.values[:, :, :n] = k[:, :, :n], v[:, :, :n]
            self.out[:, :n], self.positions[:, :n] = old[2][:, :n], old[3][:, :n]

    @torch.inference_mode()  # (the buffers are made in a forward's inference mode; the engine commits outside it)
    def select_rows(self, rows: torch.Tensor) -> None:
        self.keys, self.values, self.out, self.positions = (
            t[rows] for t in (self.keys, self.values, self.out, self.positions)
        )

    @torch.inference_mode()
    def keep(self, index: torch.Tensor) -> None:
        """Keep the entries `index` ([k], or [B, k] per row), in that order, as the first k."""
        k = index.shape[-1]
        for t, axis in ((self.keys, 2), (self.values, 2), (self.out, 1), (self.positions, 1)):
            if index.dim() == 1:
                t.narrow(axis, 0, k).copy_(t.index_select(axis, index))
            else:
                shape = [1] * t.dim()
                shape[0], shape[axis] = index.shape[0], k
                at = index.reshape(shape).expand(*t.shape[:axis], k, *t.shape[axis + 1 :])
                t.narrow(axis, 0, k).copy_(t.gather(axis, at))
        self.length = k


class LeanHead:
    """A head's layer in one call of our kernel (`dpbf16.head_layer`), as `hf/lean.py` runs a Llama's: where the head
    is bfloat16 on a CPU our kernels run on, with every map of its layer on them (`linears.pack` chose them here). Its
    eager layer is about forty small torch operators, which on a small CPU cost as much as its products. The numbers
    are close to the eager layer's (the same roundings to bfloat16), not its bits: a draft's probabilities are
    whatever it computes, so no rule depends on them."""

    def __init__(self, head: EagleHead):
        from . import linears
        from .hf.lean import layer_maps

        layer = head.layer
        maps = layer_maps(layer)
        packed = [linears.packed_weight(m) for m in maps]
        self.weights = [
            layer.input_layernorm.weight.detach(),
            *packed[:4],
            layer.post_attention_layernorm.weight.detach(),
            *packed[4:],
            layer.hidden_norm.weight.detach(),
        ]
        self.tiles = sum(1 << i for i, m in enumerate(maps) if linears.packed_kind(m) == linears.TILES)
        self.heads, self.kv_heads, self.head_dim = layer.heads, layer.kv_heads, layer.head_dim
        self.inter = layer.mlp.gate_proj.out_features
        self.eps = float(layer.input_layernorm.variance_epsilon)
        self.scaling = self.head_dim**-0.5
        self.normed_residual = layer.norm_before_residual
        self.rotary = head.rotary

    @staticmethod
    def why_not(draft: EagleDraft) -> str | None:
        """None where `draft`'s head can run here, else why not."""
        from . import dpbf16, linears

        layer = draft.head.layer
        if draft.dtype != torch.bfloat16 or draft.device.type != "cpu":
            return "not bfloat16 on a CPU"
        if dpbf16.unavailable() is not None or not dpbf16.attends_tokens(layer.head_dim, layer.head_dim):
            return "our attention kernel does not run here, or not on heads of this width"
        if getattr(draft.head.cfg.layer, "hidden_act", "silu") != "silu":
            return "not silu"
        maps = [*layer.self_attn.children(), *layer.mlp.children()]
        maps = [m for m in maps if isinstance(m, nn.Linear)]
        if len(maps) != 7 or any(m.bias is not None for m in maps) or not draft.packed_linears:
            return "biased maps, or maps not packed"
        if any(linears.packed_kind(m) not in (linears.TILES, linears.DPBF16) for m in maps):
            return "not every map of the layer runs on our kernels here"
        return None

    def step(self, cache: EagleCache, embeds, features, positions, mask) -> torch.Tensor:
        """The layer over new tokens, their entries written into `cache` from its `length` on (which the caller moves).

        Args:
            embeds, features: [B, n, hidden] the tokens' embeddings and input features.
            positions: [B, n]; mask: bool [B, n, length + n].

        Returns:
            The output features [B, n, hidden].
        """
        b, n, h = features.shape
        t, at = b * n, cache.length
        cos, sin = self.rotary(features.new_empty(1, dtype=torch.float32), positions)
        rows = torch.arange(b).repeat_interleave(n)
        slots = torch.arange(at, at + n).repeat(b)
        additive = torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(~mask.cpu(), float("-inf"))
        out = torch.ops.multispec_dpbf16.head_layer(
            embeds.to(torch.bfloat16).reshape(t, h).contiguous(),
            features.to(torch.bfloat16).reshape(t, h).contiguous(),
            self.weights,
            cache.keys,
            cache.values,
            cos.reshape(t, -1).contiguous(),
            sin.reshape(t, -1).contiguous(),
            rows,
            slots,
            additive.reshape(t, -1),
            self.heads,
            self.kv_heads,
            self.inter,
            self.eps,
            self.scaling,
            self.tiles,
            self.normed_residual,
        )
        return out.view(b, n, h)

    def outputs(self, head: EagleHead, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What `head.step` makes of the layer's output [B, n, hidden]: (the feature a child reads, the logits), the
        norm in one call."""
        b, n, h = hidden.shape
        normed = torch.ops.multispec_dpbf16.norm(hidden.reshape(b * n, h).contiguous(), head.norm.weight, self.eps)
        normed = normed.view(b, n, h)
        return (normed if head.cfg.norm_output else hidden), head.lm_head(normed)


class EagleDraft(LanguageModel):
    """A head as a draft model (module note). `target`: the model it drafts for (its vocabulary, tokenizer and stop
    tokens are the draft's)."""

    reads_target_features = True

    def __init__(self, head: EagleHead, target: LanguageModel, name: str = "eagle"):
        cfg = head.cfg
        if head.embedded_tokens < target.vocab_size:
            raise ValueError(
                f"the head embeds {head.embedded_tokens} tokens, its target {target.name} has {target.vocab_size}"
            )
        ids = head.target_ids()
        if int(ids.min()) < 0 or int(ids.max()) >= target.vocab_size:
            raise ValueError(f"the head's d2t maps draft ids outside the target's {target.vocab_size} tokens")
        self.head = head.eval()
        self.ids = ids
        self.feature_layers = tuple(cfg.target_layers)
        self.vocab_size = target.vocab_size
        self.max_length = target.max_length
        self.eos_token_id = target.eos_token_id
        self.stop_token_ids = target.stop_token_ids
        self.tokenizer = target.tokenizer
        self.device = next(head.parameters()).device
        self.dtype = next(head.parameters()).dtype
        self.name = name
        # how the head's logits are laid out: n columns, row r of its output head in column index[r] (the target's
        # vocabulary; fewer columns for a cut head, `with_head_rows`), -inf in the others
        self.columns, self.column_index = self.vocab_size, ids
        # how often the target wrote each token (`models.vocab`: `draft_vocab=N` keeps the N most frequent)
        self.token_counts: torch.Tensor | None = None
        self._cuts: dict[tuple[int, ...], EagleDraft] = {}
        # whether its linear maps run on packed weights (`linears.pack`: oneDNN's or our AMX tile kernel's, where
        # they ran faster here); None until the first forward decides
        self.packed_linears: bool | None = None
        self._lean_head: LeanHead | str | None = None  # `_lean`: the one-call layer, or why not

    def with_head_rows(self, ids: torch.Tensor, draft_vocab: int | None = None) -> EagleDraft:
        """This head drafting only the target ids `ids` ([n]): its logits are those ids', in that order (-inf for an
        id outside its draft vocabulary). Its output head keeps only their rows; every other weight and buffer is
        shared (a reduced draft vocabulary, `models.vocab`). `draft_vocab` is not read: a head runs eagerly."""
        key = tuple(ids.tolist())
        if key not in self._cuts:
            where = torch.full((self.vocab_size,), -1, dtype=torch.long, device=self.ids.device)
            where[self.ids] = torch.arange(self.ids.numel(), device=self.ids.device)
            rows = where[ids.to(self.ids.device)]
            have = (rows >= 0).nonzero().flatten()
            lm_head = self.head.lm_head
            small = nn.Linear(lm_head.in_features, have.numel(), bias=False, device=self.device, dtype=self.dtype)
            with torch.no_grad():
                small.weight.copy_(lm_head.weight[rows[have]])
            shell = copy.copy(self.head)  # the same layers; only the output head differs
            shell._modules = {**self.head._modules, "lm_head": small}
            cut = copy.copy(self)
            cut.head, cut.ids, cut._cuts = shell, self.ids[rows[have]], {}
            cut.columns, cut.column_index = ids.numel(), have
            cut.name = f"{self.name}[head={ids.numel()}]"
            self._cuts = {key: cut} if len(self._cuts) >= 4 else {**self._cuts, key: cut}
        return self._cuts[key]

    def new_cache(self) -> EagleCache:
        layer, d = self.head.layer, self.device
        keys = torch.empty(1, layer.kv_heads, 0, layer.head_dim, dtype=self.dtype, device=d)
        values = torch.empty(1, layer.kv_heads, 0, layer.head_dim + 1, dtype=self.dtype, device=d)
        out = torch.empty(1, 0, self.head.cfg.hidden, dtype=self.dtype, device=d)
        return EagleCache(keys, values, out, torch.empty(1, 0, dtype=torch.long, device=d))

    def attach(self, cache: EagleCache, target_cache: Any) -> None:
        """Read the target's features from `target_cache` (a `FeatureCache` of the generation's target)."""
        cache.source = target_cache

    def waits_for_target(self, cache: EagleCache, context_length: int) -> bool:
        """Whether drafting after `context_length` committed tokens must wait for the target to score them (in the
        first iteration it has not read the prompt yet): the head's committed entries are fed with the target's
        features only."""
        target = self._target_features(cache)
        return (0 if target is None else target.shape[1]) < context_length - 1

    def _target_features(self, cache: EagleCache | None) -> torch.Tensor | None:
        source = None if cache is None else cache.source
        return None if source is None else source.features

    def _linears(self):
        """The context the head's steps run in: its linear maps on packed weights where `linears.pack` chose them
        (decided once, at the first forward: a race of about a second, remembered per machine)."""
        from . import linears

        if self.packed_linears is None:
            self.packed_linears = linears.packable(self.head) is None and linears.pack(self.head)[0]
        return linears.active() if self.packed_linears else contextlib.nullcontext()

    @torch.inference_mode()
    def forward(self, cache, tokens, positions=None, mask=None, logits_to_keep=0, fused_prefix=0, batch_invariant=True):
        with self._linears():
            return self._forward(cache, tokens, positions, mask, logits_to_keep)

    def _forward(self, cache, tokens, positions, mask, logits_to_keep):
        b, n = tokens.shape
        past = cache.length
        if cache.rows != b and past:
            raise RuntimeError(f"{b} rows fed to a cache of {cache.rows} rows")
        cache.reserve(past + n, b)
        d = self.device
        tokens = tokens.to(d)
        positions = (torch.arange(past, past + n).expand(b, n) if positions is None else positions).to(d)
        if mask is None:  # causal: every cached entry and the new ones up to itself
            mask = torch.ones(n, past + n, dtype=torch.bool, device=d).tril(past).expand(b, n, past + n)
        mask = mask.to(d)
        lean = self._lean()
        logits = []
        start = 0
        while start < n:  # a run whose parents' features are known, then the next (one run but in odd cases)
            run, features = self._features(cache, positions[:, start:], mask[:, start:])
            stop = start + run
            at = cache.length
            step_mask = mask[:, start:stop, : at + run]
            if lean is not None:
                embeds = self.head.embed(tokens[:, start:stop])
                hidden = lean.step(cache, embeds, features, positions[:, start:stop], step_mask)
                out, cut = lean.outputs(self.head, hidden)
            else:
                keys = cache.keys[:, :, :at].transpose(1, 2)
                values = cache.values[:, :, :at, :-1].transpose(1, 2)
                out, cut, k, v = self.head.step(
                    tokens[:, start:stop], features, positions[:, start:stop], keys, values, step_mask
                )
                cache.keys[:, :, at : at + run] = k.transpose(1, 2)
                cache.values[:, :, at : at + run, :-1] = v.transpose(1, 2)
            cache.out[:, at : at + run] = out
            cache.positions[:, at : at + run] = positions[:, start:stop]
            cache.length = at + run
            logits.append(cut)
            start = stop
        cut = torch.cat(logits, 1) if len(logits) > 1 else logits[0]
        if logits_to_keep:
            cut = cut[:, -logits_to_keep:]
        dtype = torch.promote_types(cut.dtype, torch.float32)
        wide = torch.full((b, cut.shape[1], self.columns), float("-inf"), dtype=dtype, device=d)
        return wide.index_copy_(-1, self.column_index, cut.to(dtype))

    def _lean(self) -> LeanHead | None:
        """The head's one-call layer (`LeanHead`) where its maps run on our kernels here, else None (decided after
        the maps' packing, `_linears`)."""
        if self._lean_head is None:
            why = LeanHead.why_not(self)
            self._lean_head = LeanHead(self.head) if why is None else why
        return self._lean_head if isinstance(self._lean_head, LeanHead) else None

    def _features(self, cache: EagleCache, positions: torch.Tensor, mask: torch.Tensor):
        """The input features of the new tokens from the first: the target's after the previous position where it
        has scored it, else the head's own output at the token's parent (the entry at the previous position that it
        sees). Returns (the end of the run of new tokens whose features are known, their features [B, m, hidden])."""
        b, n = positions.shape
        past = cache.length
        target = self._target_features(cache)
        have = 0 if target is None else target.shape[1]
        if b == n == 1 and target is not None:  # one token (a chain's step): as below, in fewer small calls
            p = int(positions[0, 0]) - 1
            if 0 <= p < have:
                return 1, self.head.read_target(target[:1, p : p + 1].to(self.device, self.dtype))
            seen = (cache.positions[0, :past] == p) & mask[0, 0, :past]  # its parent: the first such entry
            if p >= 0 and bool(seen.any()):
                first = int(seen.int().argmax())
                return 1, cache.out[:, first : first + 1].clone()
        before = positions - 1  # [B, n]
        from_target = (before >= 0) & (before < have)
        # each token's parent among the entries it sees: cached ones (< past), or new ones (>= past)
        keys = torch.cat([cache.positions[:, :past], positions], 1)  # [B, past + n]
        is_parent = mask & (keys[:, None, :] == before[:, :, None])
        parent = is_parent.float().argmax(-1)  # [B, n]
        found = is_parent.any(-1)
        own = ~from_target & found
        # a token whose parent is new in this feed waits for the next run; without a target at all (a cost
        # measurement) it reads zeros instead, in this run
        waits = own & (parent >= past)
        if target is None:
            own, waits = own & ~waits, waits & False
        stop = n if not bool(waits.any()) else int(waits.any(0).nonzero()[0])
        if stop == 0:
            raise RuntimeError("a fed token's parent is neither cached nor earlier in its feed")
        h = self.head.cfg.hidden
        features = torch.zeros(b, stop, h, dtype=self.dtype, device=self.device)
        if target is not None and bool(from_target[:, :stop].any()):
            rows = before[:, :stop].clamp(0, max(have - 1, 0))
            picked = target.gather(1, rows[..., None].expand(-1, -1, target.shape[-1]).to(target.device))
            mapped = self.head.read_target(picked.to(self.device, self.dtype))
            features = torch.where(from_target[:, :stop, None], mapped, features)
        if bool(own[:, :stop].any()):
            theirs = cache.out[:, :past].gather(
                1, parent[:, :stop].clamp_max(max(past - 1, 0))[..., None].expand(-1, -1, h)
            )
            features = torch.where(own[:, :stop, None], theirs, features)
        return stop, features

    def crop(self, cache, length: int) -> None:
        cache.length = min(cache.length, length)

    def select_rows(self, cache, rows: torch.Tensor) -> None:
        cache.select_rows(rows.to(self.device))

    def keep_positions(self, cache, positions: torch.Tensor) -> None:
        cache.keep(positions.to(self.device))

    def encode(self, text: str, chat: bool = True) -> list[int]:
        raise ValueError("encode with the target")

    def decode(self, ids: list[int]) -> str | None:
        return None


def layer_config(vocab: int, hidden: int, heads: int, kv_heads: int, intermediate: int, **extra):
    """A `LlamaConfig` for a head's decoder layer."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=False,
        **extra,
    )


def new_head(
    target: LanguageModel,
    draft_ids: torch.Tensor | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    target_layers: tuple[int, ...] | None = None,
    seed: int = 0,
) -> EagleHead:
    """A head for `target` with fresh random weights (what `multispec distill --kind eagle` trains, and the tests'
    heads). `draft_ids`: the target ids of its draft vocabulary (default: all). A transformers target lends its
    shape (width, heads, rope), its embeddings (shared, not copied) and, by default, EAGLE-3's three layers; a
    target without decoder layers (a Markov chain) is given a small shape."""
    cfg_t = getattr(getattr(target, "model", None), "config", None)
    extra = {}
    if cfg_t is not None:
        target_hidden = cfg_t.hidden_size
        hidden = hidden or target_hidden
        heads = heads or cfg_t.num_attention_heads
        kv_heads = kv_heads or getattr(cfg_t, "num_key_value_heads", heads)
        intermediate = intermediate or getattr(cfg_t, "intermediate_size", 4 * hidden)
        for key in ("rope_theta", "rope_scaling", "rope_parameters", "rms_norm_eps", "max_position_embeddings"):
            if getattr(cfg_t, key, None) is not None:
                extra[key] = getattr(cfg_t, key)
        if getattr(cfg_t, "head_dim", None) and hidden == target_hidden:
            extra["head_dim"] = cfg_t.head_dim
        target_layers = target_layers or default_layers(cfg_t.num_hidden_layers)
    else:
        target_hidden = getattr(target, "hidden_size", 0) or 8
        hidden, heads = hidden or 16, heads or 2
        kv_heads, intermediate = kv_heads or 1, intermediate or 2 * hidden
        target_layers = target_layers or (0, 1, 2)
    ids = torch.arange(target.vocab_size) if draft_ids is None else torch.as_tensor(draft_ids).sort().values
    cfg = HeadConfig(
        layer_config(target.vocab_size, hidden, heads, kv_heads, intermediate, **extra),
        target_hidden,
        ids.numel(),
        tuple(target_layers),
    )
    torch.manual_seed(seed)
    embed = None
    base = getattr(target, "model", None)
    if base is not None and hidden == target_hidden:
        embed = base.get_input_embeddings()
    head = EagleHead(cfg, embed)
    head.d2t.copy_(ids - torch.arange(ids.numel()))
    device, dtype = target.device, getattr(target, "dtype", torch.float32)
    return head.to(device=device, dtype=dtype)


def save_eagle(head: EagleHead, folder: str | Path, verifier: str | None = None, save_embed: bool = False) -> Path:
    """Write `head` in the speculators layout (module note): `config.json` and `model.safetensors`. The embeddings are
    left out unless `save_embed` (a head that shares its target's reads them from the target when loaded)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = head.cfg
    layer = cfg.layer.to_dict()
    for key in ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path"):
        layer.pop(key, None)
    config = {
        **cfg.extra,
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": []},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.draft_vocab,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": cfg.norm_before_fc,
        "norm_output": cfg.norm_output,
        "target_hidden_size": cfg.target_hidden,
        "eagle_aux_hidden_state_layer_ids": list(cfg.target_layers),
    }
    state = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items() if not k.startswith("rotary.")}
    if save_embed and head.shared_embed:
        state["embed_tokens.weight"] = head.shared_embed[0].weight.detach().to("cpu").contiguous()
    t2d = torch.zeros(cfg.layer.vocab_size, dtype=torch.bool)
    t2d[head.target_ids().cpu()] = True
    state["t2d"] = t2d
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    return folder


def is_eagle(folder: str | Path) -> bool:
    """Whether `folder` holds a feature-level draft head (speculators or original EAGLE-3 layout)."""
    path = Path(folder).expanduser() / CONFIG
    if not path.is_file():
        return False
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    archs = config.get("architectures") or []
    return config.get("speculators_model_type") == "eagle3" or any("Eagle3" in a for a in archs)


def load_eagle(folder: str | Path, target: LanguageModel, name: str | None = None) -> EagleDraft:
    """The head in `folder` (speculators or original EAGLE-3 layout) as a draft for `target`.

    Raises:
        ValueError: a config or weights this head cannot be built from, or that do not fit `target`.
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig

    folder = Path(folder).expanduser()
    try:
        config = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{folder}: no readable {CONFIG} ({e})") from None
    layer_dict = dict(config.get("transformer_layer_config") or config)
    if config.get("speculators_model_type", "eagle3") != "eagle3":
        raise ValueError(f"{folder}: speculators_model_type {config['speculators_model_type']!r}, not 'eagle3'")
    from .vocab import COUNTS_FILE, read_token_counts

    files = sorted(f for f in folder.glob("*.safetensors") if f.name != COUNTS_FILE)
    if not files:
        raise ValueError(f"{folder}: no .safetensors weights (.bin checkpoints are not read)")
    layer_dict.setdefault("model_type", "llama")
    if layer_dict["model_type"] not in ("llama",):
        raise ValueError(f"{folder}: a head of {layer_dict['model_type']!r} layers; Llama-style layers are read")
    for key in ("architectures", "auto_map", "speculators_config", "transformer_layer_config"):
        layer_dict.pop(key, None)
    try:
        layer = AutoConfig.for_model(**layer_dict)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{folder}: its layer config cannot be read ({e})") from None
    if getattr(layer, "num_hidden_layers", 1) != 1:
        raise ValueError(f"{folder}: heads of one decoder layer are read; this one has {layer.num_hidden_layers}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    state = {k.replace("midlayer.", "layers.0.").removeprefix("model."): v for k, v in state.items()}
    target_cfg = getattr(getattr(target, "model", None), "config", None)
    target_count = getattr(target_cfg, "num_hidden_layers", None)
    ids = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    if not ids:
        if target_count is None:
            raise ValueError(f"{folder}: the head names no target layers and {target.name} has none to count")
        ids = default_layers(target_count)
    if target_count is not None and any(not 0 <= int(i) < target_count for i in ids):
        raise ValueError(f"{folder}: the head reads layers {list(ids)}; {target.name} has {target_count} layers")
    hidden = layer.hidden_size
    target_hidden = config.get("target_hidden_size") or state["fc.weight"].shape[1] // len(ids)
    if state.get("fc.weight") is None or tuple(state["fc.weight"].shape) != (hidden, len(ids) * target_hidden):
        raise ValueError(f"{folder}: fc.weight must be [{hidden}, {len(ids) * target_hidden}]")
    if target_cfg is not None and target_cfg.hidden_size != target_hidden:
        raise ValueError(
            f"{folder}: the head reads hidden states of width {target_hidden}, {target.name}'s are "
            f"{target_cfg.hidden_size}"
        )
    draft_vocab = config.get("draft_vocab_size") or state["lm_head.weight"].shape[0]
    known = ("norm_before_residual", "norm_before_fc", "norm_output")
    cfg = HeadConfig(
        layer,
        target_hidden,
        draft_vocab,
        tuple(int(i) for i in ids),
        norm_before_residual=bool(config.get("norm_before_residual", True)),
        norm_before_fc=bool(config.get("norm_before_fc", False)),
        norm_output=bool(config.get("norm_output", False)),
        extra={k: v for k, v in config.items() if k in ("speculators_version",) and k not in known},
    )
    embed = None
    if "embed_tokens.weight" not in state:
        base = getattr(target, "model", None)
        if base is None or base.get_input_embeddings().weight.shape[1] != hidden:
            raise ValueError(f"{folder}: the head has no embeddings and {target.name}'s do not fit it")
        embed = base.get_input_embeddings()
    head = EagleHead(cfg, embed)
    state.pop("t2d", None)
    if "d2t" not in state:  # the draft vocabulary is the target's
        state["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("rotary.")]
    if missing or unexpected:
        raise ValueError(f"{folder}: weights missing {missing[:5]}, unexpected {unexpected[:5]}")
    dtype = getattr(target, "dtype", torch.float32)
    head = head.to(device=target.device, dtype=dtype)
    draft = EagleDraft(head, target, name=name or str(folder))
    draft.token_counts = read_token_counts(folder)
    return draft
