"""A static KV cache for transformers models, written by our own attention function.

The model runs with `past_key_values=None`; its attention layers call `attention` (registered with
transformers as "multispec"), which writes the new keys and values into preallocated per-layer buffers
[rows, kv_heads, capacity, head_dim] at the given slots and attends over the first K of them, K being the
mask's last dimension. So:

- a rollback is a length change, and a tree commit moves only the accepted entries (`StaticKV.keep`);
- every forward has the same shapes for the same number of new tokens and rows, which is what a compiled
  step needs (`HFModel` pads new tokens to buckets of 1, 2, 4, 8, ...);
- attention is computed in float32 whatever the weights' type.

Called without our keyword arguments (transformers' own `generate` on the same model), `attention` hands
over to the implementation the model had before.
"""

from __future__ import annotations

import contextlib
import sys

import torch

NAME = "multispec"
QUERY_CHUNK = 512  # queries per block of attention scores (a long prompt's prefill)
# the fewest query rows per key head a product is computed with: CPU matmul libraries switch kernels (and
# summation order) for a handful of rows, so one token's scores would depend on how many were fed with it
MIN_QUERY_ROWS = 16
KEY_BLOCK = 256  # keys per block of the attention-weighted sum (see `_attend_block`)
_FALLBACK: dict[str, str] = {}  # model class -> its attention implementation before ours


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
    """query [B, Hq, n, d], key / value [B, Hkv, n, d]: the new tokens' (rotary already applied).
    With `ms_keys`, `ms_values` (lists of per-layer buffers) and `ms_slots` ([n] long) in kwargs: write the
    new entries at the slots, attend over the first `attention_mask.shape[-1]` entries. Returns
    ([B, n, Hq, dv], None) like transformers' implementations."""
    keys_all = kwargs.get("ms_keys")
    if keys_all is None:
        return _fallback(module)(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                 softcap=softcap, **kwargs)
    probe = kwargs.get("ms_probe")
    if probe is not None:  # shape discovery: one entry per layer that calls us
        probe.append((module.layer_idx, tuple(key.shape), tuple(value.shape), key.device))
        keys_all = None
    layer = module.layer_idx
    if keys_all is not None:
        keys, values = keys_all[layer], kwargs["ms_values"][layer]
        slots = kwargs["ms_slots"]
        if keys.device != slots.device:  # a model spread over devices (device_map): each layer's buffer is on its own
            slots, attention_mask = slots.to(keys.device), attention_mask.to(keys.device)
        keys.index_copy_(2, slots, key.to(keys.dtype))
        values.index_copy_(2, slots, value.to(values.dtype))
        width = attention_mask.shape[-1]
        k, v = keys[:, :, :width], values[:, :, :width]
    else:
        k, v = key, value
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    return attend(query, k, v, attention_mask, float(scaling), float(softcap or 0.0)).transpose(1, 2), None


# An opaque operator in compiled graphs: inductor calls it as it is, so the key length may change from step
# to step without a recompile, and no GEMM template is tried on a product with a symbolic shape.
@torch.library.custom_op("multispec::attend", mutates_args=())
def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
           scaling: float, softcap: float) -> torch.Tensor:
    """query [B, Hq, n, d], keys / values [B, Hkv, K, d], additive float mask [B, 1, n, K] -> [B, Hq, n, dv],
    in float32 whatever the inputs' type (torch's fused kernel is slower than this for a few queries on a
    CPU), then cast back to the query's."""
    n = query.shape[2]
    if n <= QUERY_CHUNK:
        return _attend_block(query, keys, values, mask, scaling, softcap)
    # a long prompt: blocks of queries bound the float32 scores held at once
    return torch.cat([_attend_block(query[:, :, i : i + QUERY_CHUNK], keys, values,
                                    None if mask is None else mask[:, :, i : i + QUERY_CHUNK], scaling, softcap)
                      for i in range(0, n, QUERY_CHUNK)], 2)


def _attend_block(query, keys, values, mask, scaling: float, softcap: float) -> torch.Tensor:
    b, hq, n, d = query.shape
    hk = keys.shape[1]
    group = hq // hk
    short = -(-MIN_QUERY_ROWS // group) - n
    if short > 0:  # batch invariance: a few query rows take other matmul kernels (summing in another order)
        out = _attend_block(torch.nn.functional.pad(query, (0, 0, 0, short)), keys, values,
                            None if mask is None else torch.nn.functional.pad(mask, (0, 0, 0, short)),
                            scaling, softcap)
        return out[:, :, :n].contiguous()  # a custom op returns what its fake promises: contiguous
    # grouped-query attention without repeating the keys: query heads j*group..(j+1)*group-1 use kv head j
    q = query.float().reshape(b, hk, group * n, d)
    scores = torch.matmul(q, keys.float().transpose(-1, -2)) * scaling  # [B, Hkv, group * n, K]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.view(b, hk, group, n, -1)
    if mask is not None:
        scores = scores + mask.float()[:, :, None]
    # Batch invariance: softmax's sum runs over vector lanes, so it depends on which slots hold a tree node's
    # keys, and a product's summation order depends on the key count. So a column of ones beside the values
    # puts the normaliser in the product, and the keys are summed in fixed blocks of KEY_BLOCK slots from
    # slot 0 (masked and padding slots weigh exactly 0), the blocks' sums added in order.
    weights = torch.exp(scores - scores.amax(-1, keepdim=True)).view(b, hk, group * n, -1)
    width, dv = values.shape[2], values.shape[-1]
    blocks = -(-width // KEY_BLOCK)
    augmented = torch.zeros(b, hk, blocks * KEY_BLOCK, dv + 1, dtype=torch.float32, device=values.device)
    augmented[:, :, :width, :dv] = values
    augmented[:, :, :width, dv] = 1.0
    weights = torch.nn.functional.pad(weights, (0, blocks * KEY_BLOCK - width))
    weights = weights.view(b, hk, group * n, blocks, KEY_BLOCK).transpose(2, 3)  # [B, Hkv, blocks, rows, KEY_BLOCK]
    partial = torch.matmul(weights, augmented.view(b, hk, blocks, KEY_BLOCK, dv + 1))  # [B, Hkv, blocks, rows, dv + 1]
    out = partial[:, :, 0]
    for i in range(1, blocks):
        out = out + partial[:, :, i]
    return (out[..., :dv] / out[..., dv:]).view(b, hq, n, -1).to(query.dtype)


@attend.register_fake
def _(query, keys, values, mask, scaling, softcap):
    return query.new_empty((*query.shape[:-1], values.shape[-1]))


def _fallback(module):
    from transformers import AttentionInterface

    name = _FALLBACK.get(type(module).__module__, "sdpa")
    if name in AttentionInterface._global_mapping:
        return AttentionInterface._global_mapping[name]
    return sys.modules[type(module).__module__].eager_attention_forward


def install(model) -> None:
    """Make `attention` the model's attention implementation (remembering the one it had)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, attention)
    # calls without our arguments (transformers' own generate) get a materialised additive mask, which both
    # fallbacks (sdpa and eager) take; ours always pass their own 4-D mask
    AttentionMaskInterface.register(NAME, eager_mask)
    before = model.config._attn_implementation
    if before != NAME:
        for module in model.modules():
            _FALLBACK.setdefault(type(module).__module__, before or "sdpa")
        _FALLBACK.setdefault(type(model).__module__, before or "sdpa")
        model.set_attn_implementation(NAME)


@contextlib.contextmanager
def stock_attention(*models):
    """Inside the block the models run the attention implementation they had before ours: transformers'
    model as it ships (the bench's `hf` peers)."""
    switched = [m for m in models if m is not None and m.config._attn_implementation == NAME]
    for m in switched:
        m.set_attn_implementation(_FALLBACK.get(type(m).__module__, "sdpa"))
    try:
        yield
    finally:
        for m in switched:
            m.set_attn_implementation(NAME)


class StaticKV:
    """Preallocated keys and values for one model: per layer [rows, kv_heads, capacity, head_dim].

    `length` entries are held in every row (the same count for all rows; rows are hypotheses). Capacity
    grows by doubling when a forward needs more; `positions` [rows, capacity] keeps each entry's position
    id for sliding-window masks."""

    def __init__(self, shapes: list[tuple[tuple[int, ...], tuple[int, ...], torch.device]], dtype: torch.dtype,
                 device: torch.device, capacity: int = 256):
        self.shapes, self.dtype, self.device = shapes, dtype, device
        self.length = 0
        self.rows = 1
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.positions = torch.zeros(1, 0, dtype=torch.long, device=device)
        self.reserve(capacity)

    @torch.inference_mode()
    def reserve(self, needed: int, rows: int | None = None) -> None:
        """At least `needed` entries per row (and `rows` rows, when given); held entries are kept."""
        rows = self.rows if rows is None else rows
        if needed <= self.capacity and rows == self.rows:
            return
        capacity = max(self.capacity, 256)
        while capacity < needed:
            capacity *= 2
        keep = min(self.length, capacity)

        def grow(old: torch.Tensor | None, shape: tuple[int, ...], dtype, device) -> torch.Tensor:
            new = torch.zeros((rows, shape[1], capacity, shape[3]), dtype=dtype, device=device)
            if old is not None and keep:
                new[: min(rows, old.shape[0]), :, :keep] = old[:rows, :, :keep]
            return new

        old_keys = self.keys or [None] * len(self.shapes)
        old_values = self.values or [None] * len(self.shapes)
        self.keys = [grow(o, ks, self.dtype, dev) for o, (ks, _, dev) in zip(old_keys, self.shapes, strict=True)]
        self.values = [grow(o, vs, self.dtype, dev) for o, (_, vs, dev) in zip(old_values, self.shapes, strict=True)]
        positions = torch.zeros(rows, capacity, dtype=torch.long, device=self.device)
        positions[: min(rows, self.positions.shape[0]), :keep] = self.positions[:rows, :keep]
        self.positions = positions
        self.capacity, self.rows = capacity, rows

    def held(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the held keys and values [rows, heads, length, d] (views)."""
        n = self.length
        return [(k[:, :, :n], v[:, :, :n]) for k, v in zip(self.keys, self.values, strict=True)]

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    @torch.inference_mode()
    def select_rows(self, rows: torch.Tensor) -> None:
        """Row i becomes old row rows[i] (rows may repeat, reorder or shrink); only held entries move."""
        rows = rows.to(self.device)
        n = self.length
        if rows.numel() == self.rows and bool((rows == torch.arange(self.rows, device=self.device)).all()):
            return
        sources = [k[:, :, :n].index_select(0, rows.to(k.device)) for k in self.keys]
        value_sources = [v[:, :, :n].index_select(0, rows.to(v.device)) for v in self.values]
        position_sources = self.positions[:, :n].index_select(0, rows)
        if rows.numel() != self.rows:
            self.keys = self.values = []
            self.rows = 0
            self.reserve(max(self.capacity, 1), rows=rows.numel())
        for buffers, new in ((self.keys, sources), (self.values, value_sources)):
            for buf, src in zip(buffers, new, strict=True):
                buf[:, :, :n] = src
        self.positions[:, :n] = position_sources

    @torch.inference_mode()
    def keep(self, index: torch.Tensor) -> None:
        """Keep the entries `index` ([L], or [rows, L] one list per row), in that order; the leading part
        that stays in place is not copied."""
        index = index.to(self.device)
        length = index.shape[-1]
        same = (index == torch.arange(length, device=self.device)).reshape(-1, length).all(0)
        moved = int(length - int(same.long().cumprod(0).sum()))
        start = length - moved
        if moved:
            tail = index[..., start:]
            if tail.dim() == 1:
                for buffers in (self.keys, self.values):
                    for buf in buffers:
                        buf[:, :, start:length] = buf.index_select(2, tail.to(buf.device))
                self.positions[:, start:length] = self.positions.index_select(1, tail)
            else:  # per row: gather [rows, heads, moved, d]
                for buffers in (self.keys, self.values):
                    for buf in buffers:
                        at = tail.to(buf.device)[:, None, :, None].expand(-1, buf.shape[1], -1, buf.shape[3])
                        buf[:, :, start:length] = buf.gather(2, at)
                self.positions[:, start:length] = self.positions.gather(1, tail)
        self.length = length
