"""Eager steps of a Llama model in one call of our kernel per decoder layer (`dpbf16.llama_layer`).

transformers' eager Llama runs about thirty small operators per layer through Python and torch's dispatcher; on a
small CPU they cost about as much as the layer's products (measured in docs/decisions.md). Where every linear map of
the model runs on our kernel (`linears`, the race won here: the AMX tile kernel, or the AVX512-BF16 dot-product one
on a CPU without AMX) and its attention on `dpbf16.attend_tokens` (`HFModel.kernel_attention`), a step runs here
instead: the embedding and the rotary angles in torch, then one C++
call per layer (norm, products, rotary embedding, cache writes, attention, MLP, residuals), then the final norm and
the output head on the kept tokens only.

Every part works token by token with its sums in one order, so a token gets the same bits whatever else is fed with it:
single steps, the steps of a cache of several rows (beam search's hypotheses, laid end to end) and batched steps
(`HFModel.forward_rows`) go through here alike, and a sequence keeps its logits alone and in a batch. The numbers are
close to transformers' (the same roundings to bfloat16 after each part), not its bits. The inputs of the layers that
`HFModel.hidden_features` reads (a feature-level draft head's) are kept as they pass, at no cost. Compiled steps, a
model whose layers carry other hooks, and every other model keep transformers' forward.
"""

from __future__ import annotations

import torch

from .. import linears

FAMILIES = ("LlamaForCausalLM",)  # the decoder layer `llama_layer` computes


def layer_maps(layer) -> list[torch.nn.Module]:
    """A decoder layer's seven linear maps in the order `dpbf16.llama_layer` (and `head_layer`) takes them: q, k, v, o,
    gate, up, down."""
    return [
        *(getattr(layer.self_attn, f"{p}_proj") for p in "qkvo"),
        *(getattr(layer.mlp, f"{p}_proj") for p in ("gate", "up", "down")),
    ]


class LeanLlama:
    """The weights `dpbf16.llama_layer` reads, gathered once from an `HFModel` (see `why_not`)."""

    def __init__(self, hf):
        model = hf.model
        cfg = model.config
        self.hf, self.model = hf, model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.inter, self.eps = cfg.intermediate_size, float(cfg.rms_norm_eps)
        self.layers = model.model.layers
        self.weights, self.tiles = [], []
        for layer in self.layers:
            maps = layer_maps(layer)
            packed = [linears.packed_weight(m) for m in maps]
            self.weights.append(
                [
                    layer.input_layernorm.weight.detach(),
                    *packed[:4],
                    layer.post_attention_layernorm.weight.detach(),
                    *packed[4:],
                ]
            )
            # the maps on the tile kernel (bit i: the i-th of `layer_maps`); the others run on the dot-product one
            # (`why_not`: every map on one of the two, each summing a row in one order)
            self.tiles.append(sum(1 << i for i, m in enumerate(maps) if linears.packed_kind(m) == linears.TILES))
        self.scaling = [float(layer.self_attn.scaling) for layer in self.layers]
        self._first = self._weight_id()

    def _weight_id(self):
        q = self.layers[0].self_attn.q_proj.weight
        return q.data_ptr(), q.dtype

    @staticmethod
    def why_not(hf) -> str | None:
        """None where `hf`'s eager steps can run here, else why not."""
        model = hf.model
        if type(model).__name__ not in FAMILIES:
            return f"{type(model).__name__} is not a Llama"
        if not hf.kernel_attention():
            return "attention does not run on our kernel here"
        cfg = model.config
        if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "attention_bias", False):
            return "not silu, or biased attention"
        if getattr(cfg, "mlp_bias", False) or cfg.hidden_size % 2 or cfg.intermediate_size % 2:
            return "biased MLP, or odd widths"
        maps = [m for layer in model.model.layers for m in (*layer.self_attn.children(), *layer.mlp.children())]
        maps = [m for m in maps if type(m) is torch.nn.Linear]
        ours = (linears.TILES, linears.DPBF16)
        if len(maps) != 7 * len(model.model.layers) or any(linears.packed_kind(m) not in ours for m in maps):
            return "not every linear map runs on our kernels here"
        return None

    def usable(self) -> bool:
        """Whether this step may run now: the weights it gathered are the model's, and no hook but the model's own
        (`HFModel.hidden_features`, whose reads `step` serves) waits on a layer."""
        if self._weight_id() != self._first:
            return False
        ours = len(getattr(self.hf, "_hooked", ()))
        return not any(layer._forward_hooks for layer in self.layers) and ours == sum(
            len(layer._forward_pre_hooks) for layer in self.layers
        )

    @staticmethod
    def fused_spans(packed, fused: int, rows: int = 1, n: int = 0) -> list[int]:
        """The (start, count) pairs, flat, of the tokens that attend through torch's fused attention: a prompt's
        first tokens fed into empty rows (`HFModel.forward`'s `fused_prefix`: the first `fused` of each of an
        unpacked step's `rows` rows of n tokens; a packed step's groups)."""
        if packed is None:
            return [x for row in range(rows) for x in (row * n, fused)] if fused else []
        spans = []
        for group in packed.groups:
            if group.fused:
                first = group.index[0, : group.fused]
                start = int(first[0])
                if not torch.equal(first, torch.arange(start, start + group.fused)):
                    raise ValueError("a prompt's fused tokens are not one span of the packed step")
                spans += [start, group.fused]
        return spans

    @torch.inference_mode()
    def step(self, ids, positions, masks, slots, keys, values, logits_to_keep, fused, packed) -> torch.Tensor:
        """`HFModel.step`'s arguments (the step of a cache's b rows, each fed n tokens, or a packed one with
        `packed`); returns the kept logits in bfloat16, as transformers' forward would: [b, k, vocab], or
        [1, k, vocab] for a packed step."""
        b, n = ids.shape
        # the rows' tokens end to end, each with its cache row and slot: [T = b * n, H]
        hidden = self.model.model.embed_tokens(ids).reshape(b * n, -1).contiguous()
        cos, sin = self.model.model.rotary_emb(hidden.new_empty(1, dtype=torch.float32), positions)
        cos, sin = cos.reshape(b * n, -1).contiguous(), sin.reshape(b * n, -1).contiguous()  # [T, d] float32
        if packed is not None:
            rows, slots, mask = packed.token_rows, packed.token_slots, packed.token_masks()
            keep = logits_to_keep
        else:
            rows = torch.arange(b).repeat_interleave(n)
            slots = slots.repeat(b)  # [width]: every row writes the same slots
            mask = masks[:, 0].expand(b, -1, -1).reshape(b * n, -1).float().contiguous()  # [T, K] additive
            k = logits_to_keep or n
            keep = (torch.arange(b)[:, None] * n + torch.arange(n - k, n)[None, :]).flatten()
        spans = self.fused_spans(packed, fused, b, n)
        # the layers' inputs being read (`HFModel.hidden_features`), as its hooks would see them: [b, n, H]
        seen = getattr(getattr(self.hf, "_capture", None), "seen", None)
        reading = self.hf._hooked if seen is not None else ()
        layers = zip(self.weights, keys, values, self.scaling, self.tiles, strict=True)
        for i, (weights, key, value, scaling, tiles) in enumerate(layers):
            if i in reading:
                # (each layer returns a new tensor: this one stays as it is)
                seen[i] = hidden.view(b, n, -1) if packed is None else hidden[None]
            hidden = torch.ops.multispec_dpbf16.llama_layer(
                hidden,
                weights,
                key,
                value,
                cos,
                sin,
                rows,
                slots,
                mask,
                spans,
                self.heads,
                self.kv_heads,
                self.inter,
                self.eps,
                scaling,
                tiles,
            )
        hidden = torch.ops.multispec_dpbf16.norm(hidden[keep].contiguous(), self.model.model.norm.weight, self.eps)
        with linears.active():
            logits = self.model.lm_head(hidden)
        return logits[None] if packed is not None else logits.view(b, -1, logits.shape[-1])
