"""A static KV cache for transformers models, written by our own attention function.

The model runs with `past_key_values=None`; its attention layers call `attention` (registered with
transformers as "multispec"), which writes the new keys and values into preallocated per-layer buffers
[rows, kv_heads, capacity, head_dim] at the given slots and attends over the first K of them, K being the
mask's last dimension. So:

- a rollback is a length change, and a tree commit moves only the accepted entries (`StaticKV.keep`);
- every forward has the same shapes for the same number of new tokens and rows, which is what a compiled
  step needs (`HFModel` pads new tokens to buckets of 1, 2, 4, 8, ...);
- attention is computed in float32 whatever the weights' type (the cache is held in float32, or in bfloat16
  for a bfloat16 model whose steps attend through our kernel: `StaticKV`), and on the eager path a
  token's output does not depend on how many tokens were scored with it, or where a tree put them
  (`_attend_block`); a compiled step traces plain softmax attention into its graph instead (`attend_traced`:
  fused, not batch-invariant, as the rest of a compiled step is not), unless it is the batch-invariant one
  (`compile="invariant"`), which calls `attend` too.

Called without our keyword arguments (transformers' own `generate` on the same model), `attention` hands
over to the implementation the model had before.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from . import dpbf16

NAME = "multispec"
# bumped when the compiled step's graph changes (not its results): packages and cost curves of the old one are
# made again. 2: values written into the cache buffer whole (`attention`); 3: `CONCAT` variants (kernel choices
# made without them are made again)
STEP_VERSION = 3
QUERY_CHUNK = 256  # queries per block of attention scores (a long prompt's prefill; bounds the scores held)
# CPU matmul libraries switch kernels (and summation order) for a handful of rows, so one token's scores would
# depend on how many were fed with it: every product gets at least `query_rows(...)` rows, measured per machine
# and never more than this
MIN_QUERY_ROWS = 16
_QUERY_ROWS: dict[tuple, int] = {}
KEY_BLOCK = 256  # keys per block of the attention-weighted sum (see `_attend_block`)
# A query at position P sums the values of the key slots before P // TAIL * TAIL - TAIL in float32 KEY_BLOCKs,
# and the rest in float64 (`_attend_block` (4), `splits`): a tree node of depth up to TAIL + 1 gets a chain
# step's bits
TAIL = 16
_FALLBACK: dict[str, str] = {}  # model class -> its attention implementation before ours
TRACED_ATTENTION = True  # compiled steps trace `attend_traced` (False: the opaque batch-invariant `attend`)


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
    """query [B, Hq, n, d], key / value [B, Hkv, n, d]: the new tokens' (rotary already applied).
    With `ms_keys`, `ms_values` (lists of per-layer `StaticKV` buffers) and `ms_slots` ([n] long, or [B, n]: per
    row) in kwargs:
    write the new entries at the slots, attend over the first `attention_mask.shape[-1]` slots. Returns
    ([B, n, Hq, dv], None) like transformers' implementations."""
    keys_all = kwargs.get("ms_keys")
    if keys_all is None:
        return _fallback(module)(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, softcap=softcap, **kwargs
        )
    probe = kwargs.get("ms_probe")
    if probe is not None:  # shape discovery: one entry per layer that calls us
        probe.append((module.layer_idx, tuple(key.shape), tuple(value.shape), key.device))
        keys_all = None
    layer = module.layer_idx
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    packed = kwargs.get("ms_packed")
    if packed is not None and keys_all is not None:
        sliding = attention_mask.shape[-1] == 2  # the layer's kind (`HFModel._packed_masks`)
        out = attend_packed(
            query,
            key,
            value,
            keys_all[layer],
            kwargs["ms_values"][layer],
            packed,
            sliding,
            float(scaling),
            softcap,
            kernel=bool(kwargs.get("ms_kernel")),
        )
        return out, None
    if keys_all is not None:
        keys, values = keys_all[layer], kwargs["ms_values"][layer]
        slots = kwargs["ms_slots"]
        if keys.device != slots.device:  # a model spread over devices (device_map): each layer's buffer is on its own
            slots, attention_mask = slots.to(keys.device), attention_mask.to(keys.device)
        if slots.dim() == 1:
            keys.index_copy_(2, slots, key.to(keys.dtype))
            # whole entries, ones included, into the buffer itself: a compiled step that writes into a view of it
            # (the values without their ones) copies the whole buffer, a cost that grows with the capacity
            values.index_copy_(2, slots, with_ones(value, values.dtype))
        else:  # [B, n]: each row's own slots (rows of a batch hold sequences of their own lengths)
            at = slots[:, None, :, None]
            keys.scatter_(2, at.expand(-1, keys.shape[1], -1, keys.shape[3]), key.to(keys.dtype))
            values.scatter_(2, at.expand(-1, values.shape[1], -1, values.shape[3]), with_ones(value, values.dtype))
        width = attention_mask.shape[-1]
        fused = kwargs.get("ms_fused", 0)
        split = kwargs.get("ms_splits")
        if split is not None and split.device != keys.device:
            split = split.to(keys.device)
        if fused and not softcap:
            # the first `fused` tokens, a prompt's start fed into an empty cache, attend causally among themselves
            # through torch's fused kernel; the rest as in a step (`HFModel.forward`, `fused_prefix`)
            head = torch.nn.functional.scaled_dot_product_attention(
                query[:, :, :fused],
                key[:, :, :fused],
                value[:, :, :fused],
                is_causal=True,
                scale=scaling,
                enable_gqa=True,
            )
            if fused < query.shape[2]:
                if kwargs.get("ms_kernel"):
                    rest = dpbf16.attend(
                        query[:, :, fused:],
                        keys,
                        values,
                        attention_mask[:, :, fused:].float(),
                        value.shape[-1],
                        float(scaling),
                    )
                else:
                    rest = attend(
                        query[:, :, fused:],
                        keys[:, :, :width],
                        values[:, :, : whole_blocks(width)],
                        attention_mask[:, :, fused:],
                        float(scaling),
                        0.0,
                        split,
                    )
                head = torch.cat([head, rest], 2)
            return head.transpose(1, 2), None
        if (
            (kwargs.get("ms_exact") or kwargs.get("ms_kernel"))
            and not softcap
            and dpbf16.attends(query.shape[-1], value.shape[-1])
        ):
            # the batch-invariant compiled step on our kernels (`HFModel`, `hf.INVARIANT_DPBF16`): one pass per
            # query row, sums in a fixed order, invariant to rows and to a tree's layout without splits
            out = dpbf16.attend(query, keys, values, attention_mask.float(), value.shape[-1], float(scaling))
            return out.transpose(1, 2), None
        if TRACED_ATTENTION and split is None and torch.compiler.is_compiling():
            # inside a compiled step: plain operators that inductor fuses (one softmax kernel between two
            # products) with the key length symbolic; the batch-invariant `attend` runs as a dozen separate
            # operators per layer, and only the batch-invariant compiled step (which passes splits) needs it
            return attend_traced(
                query,
                keys[:, :, :width],
                values[:, :, :width, :-1],
                attention_mask,
                float(scaling),
                float(softcap or 0.0),
            ).transpose(1, 2), None
        # the whole buffers: `attend` reads the first `width` slots (slicing them here would tie the key length
        # to the cache's capacity in an exported step)
        k, v = keys, values
    else:
        k, v, split = key.float(), with_ones(value), None
    return attend(query, k, v, attention_mask, float(scaling), float(softcap or 0.0), split).transpose(1, 2), None


def attend_packed(
    query, key, value, keys, values, packed, sliding: bool, scaling: float, softcap, kernel: bool = False
) -> torch.Tensor:
    """Attention of a packed step (`hf.inputs.PackedStep`): query [1, Hq, T, d], key / value [1, Hkv, T, d] of
    every row's new tokens in one sequence. Writes each token's entry into its row and slot of the batch buffers
    keys / values [R, Hkv, C, ...], then attends each row over its own cache row (so a row's output does not
    depend on the other rows, their number or widths): with `kernel` (`HFModel.kernel_attention`), every token
    in one call of `dpbf16.attend_tokens`, else group by group through `attend`. Returns [1, T, Hq, dv]; the
    padding tokens' outputs are zeros (or, with `kernel`, unused numbers)."""
    device = keys.device  # (a model spread over devices: each layer's buffers are on its own)
    rows, slots = packed.token_rows.to(device), packed.token_slots.to(device)
    keys[rows, :, slots] = key[0].transpose(0, 1).to(keys.dtype)
    values[rows, :, slots] = with_ones(value[0], values.dtype).transpose(0, 1)
    hq, t, _ = query.shape[1:]
    if kernel and not sliding and not softcap:
        # every token in one call of our kernel over its own row (no group's gathered copy of the rows), with the
        # bits `dpbf16.attend` gives a sequence's step alone
        mask = packed.token_masks()
        out = dpbf16.attend_tokens(query[0].transpose(0, 1), keys, values, rows, mask, value.shape[-1], scaling)
        for group in packed.groups:
            if group.fused:  # a prompt's first tokens, as a sequence's prompt alone attends them (`attention`)
                first = group.index[0, : group.fused].to(device)
                head = torch.nn.functional.scaled_dot_product_attention(
                    query[:, :, first],
                    key[:, :, first],
                    value[:, :, first],
                    is_causal=True,
                    scale=scaling,
                    enable_gqa=True,
                )
                out[first] = head[0].transpose(0, 1).to(out.dtype)
        return out[None]
    out = query.new_zeros(hq, t, value.shape[-1])
    for group in packed.groups:
        masks = group.masks
        if isinstance(masks, dict):
            masks = masks["sliding_attention" if sliding else "full_attention"]
        masks, index = masks.to(device), group.index.to(device)
        g, w = index.shape
        q = query[0][:, index].transpose(0, 1)  # [g, Hq, w, d]
        width = masks.shape[-1]
        split = None
        if query.dtype in (torch.bfloat16, torch.float16) and q.is_cpu:
            split = splits(group.positions.to(device))
        span_keys, span_values = keys[group.rows, :, :width], values[group.rows, :, : whole_blocks(width)]
        if group.fused and not softcap:
            # a prompt's first tokens, nothing held: causally among themselves in torch's fused kernel, the rest
            # as a step, as `HFModel.forward` attends a prompt fed alone (`fused_prefix`)
            f = group.fused
            head = torch.nn.functional.scaled_dot_product_attention(
                q[:, :, :f],
                key[:, :, index[0, :f]],
                value[:, :, index[0, :f]],
                is_causal=True,
                scale=scaling,
                enable_gqa=True,
            )
            if f < w:
                rest = attend(
                    q[:, :, f:],
                    span_keys,
                    span_values,
                    masks[:, :, f:],
                    scaling,
                    0.0,
                    None if split is None else split[:, f:],
                )
                head = torch.cat([head, rest], 2)
            got = head
        else:
            got = attend(q, span_keys, span_values, masks, scaling, float(softcap or 0.0), split)
        got = got.transpose(0, 1).reshape(hq, g * w, -1)  # [Hq, g * w, dv]
        out.index_copy_(1, group.tokens.to(device), got.index_select(1, group.fill.to(device)).to(out.dtype))
    return out.transpose(0, 1)[None]


def attend_traced(query, keys, values, mask, scaling: float, softcap: float) -> torch.Tensor:
    """query [B, Hq, n, d], keys [B, Hkv, K, d] and values [B, Hkv, K, dv] (float32, or a bfloat16 cache's),
    additive mask [B, 1, n, K] -> [B, Hq, n, dv] in the query's type: softmax attention in float32, grouped queries
    without repeating keys, for tracing into a compiled graph."""
    b, hq, n, d = query.shape
    hk = keys.shape[1]
    group = hq // hk
    q = query.float().reshape(b, hk, group * n, d)
    keys, values = keys.float(), values.float()  # a bfloat16 cache's numbers, exactly (float32: as they are)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scaling  # [B, Hkv, group * n, K]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        scores = (scores.view(b, hk, group, n, -1) + mask.float()[:, :, None]).view(b, hk, group * n, -1)
    out = torch.matmul(torch.softmax(scores, -1), values)  # [B, Hkv, group * n, dv]
    return out.view(b, hq, n, -1).to(query.dtype)


def whole_blocks(width: int) -> int:
    """`width` key slots rounded up to whole KEY_BLOCKs: the slots the values product reads."""
    return -(-width // KEY_BLOCK) * KEY_BLOCK


def with_ones(values: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[..., K, dv] -> [..., K, dv + 1] in `dtype`: the values beside a column of ones, the layout `attend` takes
    (the ones make the softmax normaliser part of the same product)."""
    return torch.cat([values.to(dtype), values.new_ones(*values.shape[:-1], 1, dtype=dtype)], -1)


# An opaque operator in compiled graphs: inductor calls it as it is, so the key length may change from step
# to step without a recompile, and no GEMM template is tried on a product with a symbolic shape.
@torch.library.custom_op("multispec::attend", mutates_args=())
def attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    softcap: float,
    split: torch.Tensor | None = None,
) -> torch.Tensor:
    """query [B, Hq, n, d], keys [B, Hkv, K, d] and values with ones [B, Hkv, K', dv + 1] (float32, or bfloat16
    widened here; `with_ones`; K' >= K: slots up to K rounded up to whole KEY_BLOCKs, finite, padded when missing),
    additive float mask [B, 1, n, K], optionally each query's split [B, n] (`splits`) -> [B, Hq, n, dv],
    computed in float32 whatever the query's type (torch's fused kernel is slower than this for a few queries on
    a CPU; with splits, the slots from a query's split on in float64), cast to the query's. Keys and values may
    be longer (a cache's buffers): the slots past the mask's K are not read."""
    if mask is not None and keys.shape[2] > mask.shape[-1]:
        keys, values = keys[:, :, : mask.shape[-1]], values[:, :, : whole_blocks(mask.shape[-1])]
    keys, values = keys.float(), values.float()  # a bfloat16 cache's numbers, exactly (float32: as they are)
    n = query.shape[2]
    if n <= QUERY_CHUNK:
        return _attend_block(query, keys, values, mask, scaling, softcap, split=split)
    # a long prompt: blocks of queries bound the float32 scores held at once, and each block reads the keys
    # up to the last one any of its queries sees (a causal prompt's first blocks skip most of them). The
    # slots left out would weigh exactly 0 and sit in whole value blocks past the ones read, so every token
    # gets the same bits as over all the keys
    out = []
    for i in range(0, n, QUERY_CHUNK):
        rows = None if mask is None else mask[:, :, i : i + QUERY_CHUNK]
        width = keys.shape[2] if rows is None else _seen_width(rows)
        out.append(
            _attend_block(
                query[:, :, i : i + QUERY_CHUNK],
                keys[:, :, :width],
                values[:, :, : whole_blocks(width)],
                None if rows is None else rows[..., :width],
                scaling,
                softcap,
                split=None if split is None else split[:, i : i + QUERY_CHUNK],
            )
        )
    return torch.cat(out, 2)


def _seen_width(mask: torch.Tensor) -> int:
    """1 + the last key slot that any row of an additive mask [B, 1, n, K] lets through (at least 1)."""
    seen = (mask > torch.finfo(mask.dtype).min / 2).flatten(0, 2).any(0)
    return max(1, int(seen.nonzero()[-1]) + 1) if bool(seen.any()) else 1


def query_rows(group: int, kv_heads: int, head_dim: int, value_dim: int, device) -> int:
    """The fewest query rows per key head from which `_attend_block`, as this machine computes it, gives every
    token the same bits whether it is attended alone or with others (up to MIN_QUERY_ROWS, which holds on
    the machines measured so far). Measured once per shapes, device and thread count: a few hundred small
    products, well under a second."""
    key = (group, kv_heads, head_dim, value_dim, str(device), torch.get_num_threads())
    if key not in _QUERY_ROWS:
        gen = torch.Generator().manual_seed(0)
        tokens = -(-2 * MIN_QUERY_ROWS // group)
        fewest = 1
        for width in (300, 700):  # one block of values and several, a partial last block in each
            q = torch.randn(1, group * kv_heads, tokens, head_dim, generator=gen).to(device)
            # slices of a larger buffer, as the cache's are (a library may choose its kernel by the strides)
            keys = torch.randn(1, kv_heads, 1024, head_dim, generator=gen).to(device)[:, :, :width]
            values = with_ones(torch.randn(1, kv_heads, 1024, value_dim, generator=gen).to(device))[:, :, :width]
            mask = torch.zeros(1, 1, tokens, width, device=device)
            full = _attend_block(q, keys, values, mask, 0.125, 0.0, MIN_QUERY_ROWS)
            for rows in range(MIN_QUERY_ROWS - 1, fewest - 1, -1):  # down from the top: the first that fails bounds it
                # every token in products of t tokens padded to `rows` rows, or of exactly `rows` rows (whether
                # the order changes a rounding depends on the numbers, so one product is not enough to see it)
                if any(
                    not torch.equal(
                        _attend_block(q[:, :, i : i + t], keys, values, mask[:, :, i : i + t], 0.125, 0.0, rows),
                        full[:, :, i : i + t],
                    )
                    for t in range(1, tokens)
                    if group * t <= rows
                    for i in range(0, tokens, t)
                ):
                    fewest = rows + 1
                    break
        _QUERY_ROWS[key] = fewest
    return _QUERY_ROWS[key]


def splits(positions: torch.Tensor) -> torch.Tensor:
    """Each query's split [B, n] from its position [B, n] (`_attend_block` (4)): P // TAIL * TAIL - TAIL, at
    least 0. A function of the position alone, and more than TAIL below it: for a tree node of depth up to
    TAIL + 1, scored with every position before the tree's root at its own slot, the slots before its split
    hold what they hold for a chain step at its position."""
    return (positions.div(TAIL, rounding_mode="floor") * TAIL - TAIL).clamp_(min=0)


def _attend_block(
    query,
    keys,
    values,
    mask,
    scaling: float,
    softcap: float,
    min_rows: int | None = None,
    split: torch.Tensor | None = None,
):
    # Batch invariance: a token's output must not depend on how many tokens, or which tree, it is scored
    # with. So (1) every product has at least `query_rows(...)` rows (CPU matmul libraries switch kernels, and
    # summation order, for a handful of rows); (2) the normaliser is a column of ones in the values product
    # (softmax sums over vector lanes, so it would depend on which slots hold a node's keys); (3) keys are
    # summed in fixed blocks of KEY_BLOCK slots from slot 0, the blocks' sums added in order (a product's
    # summation order depends on its length). Masked slots, and those past the held entries, weigh exactly 0.
    # (4) With `split` (`splits`): a tree node's entries sit at its index in the tree, not at its position as a
    # chain step's do, so in one float32 product its terms would meet other vector lanes and round otherwise.
    # So each query sums the slots before its split (which a tree and a chain hold alike) as in (3), and the
    # rest in float64, where their order moves the sum far below a rounding step of the output.
    b, hq, n, d = query.shape
    hk, width = keys.shape[1], keys.shape[2]
    group = hq // hk
    span = whole_blocks(width)
    if values.shape[2] < span:  # callers other than the static cache: pad to whole blocks
        values = torch.nn.functional.pad(values, (0, 0, 0, span - values.shape[2]))
    rows = group * n  # grouped-query attention without repeating keys: query heads j*group.. use kv head j
    q = query.float().reshape(b, hk, rows, d)
    if min_rows is None:
        min_rows = query_rows(group, hk, d, values.shape[-1] - 1, query.device)
    if rows < min_rows:
        q = torch.nn.functional.pad(q, (0, 0, 0, min_rows - rows))  # padding rows: zeros, scores 0
    scores = torch.matmul(q, keys.float().transpose(-1, -2))  # [B, Hkv, rows+, K]
    scores.mul_(scaling)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        scores[:, :, :rows].view(b, hk, group, n, width).add_(mask.float()[:, :, None])
    weights = scores.sub_(scores.amax(-1, keepdim=True)).exp_()
    if split is not None:
        return _split_sum(weights, values, split.clamp(max=width), group, rows, query.dtype).view(b, hq, n, -1)
    if span > width:  # the slots past the last key weigh exactly 0
        weights = torch.nn.functional.pad(weights, (0, span - width))
    out = _blocks_sum(weights, values)[:, :, :rows]
    return (out[..., :-1] / out[..., -1:]).view(b, hq, n, -1).to(query.dtype)


def _blocks_sum(weights, values) -> torch.Tensor:
    """(3) of `_attend_block`: weights [B, Hkv, R, S] (S whole KEY_BLOCKs) times values [B, Hkv, >= S, dv + 1],
    one product per block of KEY_BLOCK slots from slot 0, added in order -> float32 [B, Hkv, R, dv + 1]."""
    b, hk, padded, span = weights.shape
    weights = weights.reshape(b * hk, padded, span)
    values = values[:, :, :span].reshape(b * hk, span, -1)
    out = torch.bmm(weights[..., :KEY_BLOCK], values[:, :KEY_BLOCK])  # [B * Hkv, R, dv + 1]
    for start in range(KEY_BLOCK, span, KEY_BLOCK):
        out = torch.baddbmm(out, weights[..., start : start + KEY_BLOCK], values[:, start : start + KEY_BLOCK])
    return out.view(b, hk, padded, -1)


def _split_sum(weights, values, split, group: int, rows: int, dtype) -> torch.Tensor:
    """The attention-weighted values of `_attend_block` (4): weights [B, Hkv, R, K] (R >= rows = group * n, the
    query rows then padding), values with ones [B, Hkv, >= whole_blocks(K), dv + 1], split [B, n] (<= K) ->
    [B, Hkv, rows, dv] in `dtype`."""
    b, hk, padded, width = weights.shape
    low, high = (int(x) for x in split.aminmax())
    between = None
    if high > low:  # [B, 1, R, high - low]: which slots between the splits each row sums in float32
        n = split.shape[-1]
        row_split = split[:, None, :].expand(b, group, n).reshape(b, 1, rows)
        if padded > rows:  # the padding rows' outputs are dropped: any split
            row_split = torch.nn.functional.pad(row_split, (0, padded - rows), value=high)
        between = torch.arange(low, high, device=weights.device) < row_split[..., None]
    # float64: the slots from the lowest split on, each row's before its own split weighing 0
    tail = weights[..., low:].double()
    if between is not None:
        tail[..., : high - low].masked_fill_(between, 0.0)
    out = torch.matmul(tail, values[:, :, low:width].double())  # [B, Hkv, R, dv + 1]
    if high:  # float32 KEY_BLOCKs before the highest split, each row's from its own split on weighing 0
        span = whole_blocks(high)
        front = torch.nn.functional.pad(weights[..., :high], (0, span - high))
        if between is not None:
            front[..., low:high].masked_fill_(~between, 0.0)
        out += _blocks_sum(front, values)
    out = out[:, :, :rows]
    return (out[..., :-1] / out[..., -1:]).to(dtype)


@attend.register_fake
def _(query, keys, values, mask, scaling, softcap, split=None):
    return query.new_empty((*query.shape[:-1], values.shape[-1] - 1))


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


def bucket(k: int) -> int:
    """The power of two a padded forward (a compiled or captured step) of k new tokens runs at."""
    return 1 << max(0, k - 1).bit_length()


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
    """Preallocated keys and values for one model, in `storage`: float32 by default (the type attention runs
    in, so no layer converts its cache at every step), or bfloat16 for a bfloat16 model whose steps attend through
    our kernel (`dpbf16.attend` widens them as it reads: half the bytes a step reads, the same numbers, since a
    bfloat16 model's keys and values are bfloat16). Per layer keys [rows, kv_heads, capacity, head_dim] and values
    beside a column of ones [rows, kv_heads, capacity, head_dim + 1] (`with_ones`).

    Layers of the same shapes on the same device share one buffer [layers, rows, heads, capacity, d], and
    `keys` / `values` are its per-layer views: a commit or a row reorder is then a few torch calls, not a
    few per layer (a tree iteration's commit made ~100 calls with a buffer per layer).

    `length` entries are held in every row (the same count for all rows; rows are hypotheses). Capacity is
    a multiple of KEY_BLOCK and grows by doubling when a forward needs more; `positions` [rows, capacity]
    keeps each entry's position id for sliding-window masks."""

    def __init__(
        self,
        shapes: list[tuple[tuple[int, ...], tuple[int, ...], torch.device]],
        dtype: torch.dtype,
        device: torch.device,
        capacity: int = KEY_BLOCK,
        storage: torch.dtype = torch.float32,
    ):
        self.shapes, self.dtype, self.device, self.storage = shapes, dtype, device, storage
        self.length = 0
        self.rows = 1
        self.capacity = 0
        # the leading entries held alike in every row (a prompt fed once, then spread over hypotheses): a
        # reorder of the rows leaves them where they are
        self.shared = 0
        # layers grouped by (key heads, key dim, value heads, value dim, device): one buffer per group
        groups: dict[tuple, list[int]] = {}
        for layer, (ks, vs, dev) in enumerate(shapes):
            groups.setdefault((ks[1], ks[3], vs[1], vs[3], str(dev)), []).append(layer)
        self._groups = list(groups.items())
        self.key_buffers: list[torch.Tensor] = []  # per group [layers, rows, heads, capacity, d]
        self.value_buffers: list[torch.Tensor] = []  # per group [layers, rows, heads, capacity, dv + 1]
        self.keys: list[torch.Tensor] = []  # per layer, views of the group buffers
        self.values: list[torch.Tensor] = []
        self.positions = torch.zeros(1, 0, dtype=torch.long, device=device)
        # what this cache's steps may run (a generation's own): a compiled or captured step that failed turns
        # them off here, never for the model (`HFModel.forward`); `invariant_kind` overrides the model's variant
        self.compiled, self.captured, self.invariant_kind = True, True, None
        self.reserve(capacity)

    @torch.inference_mode()
    def reserve(self, needed: int, rows: int | None = None) -> None:
        """At least `needed` entries per row (and `rows` rows, when given); held entries are kept."""
        rows = self.rows if rows is None else rows
        if needed <= self.capacity and rows == self.rows:
            return
        capacity = max(self.capacity, KEY_BLOCK)
        while capacity < needed:
            capacity *= 2
        keep = min(self.length, capacity)

        def grow(old: torch.Tensor | None, layers: int, heads: int, dim: int, device, ones: bool) -> torch.Tensor:
            # zeros, not empty: slots past the held entries are multiplied by weight 0 (whole key blocks)
            new = torch.zeros((layers, rows, heads, capacity, dim + ones), dtype=self.storage, device=device)
            if ones:
                new[..., -1] = 1.0
            if old is not None and keep:
                new[:, : min(rows, old.shape[1]), :, :keep] = old[:, :rows, :, :keep]
            return new

        old_keys = self.key_buffers or [None] * len(self._groups)
        old_values = self.value_buffers or [None] * len(self._groups)
        self.key_buffers, self.value_buffers = [], []
        keys: list[torch.Tensor | None] = [None] * len(self.shapes)
        values: list[torch.Tensor | None] = [None] * len(self.shapes)
        for ((key_heads, key_dim, value_heads, value_dim, _), layers), old_k, old_v in zip(
            self._groups, old_keys, old_values, strict=True
        ):
            device = self.shapes[layers[0]][2]
            k = grow(old_k, len(layers), key_heads, key_dim, device, False)
            v = grow(old_v, len(layers), value_heads, value_dim, device, True)
            self.key_buffers.append(k)
            self.value_buffers.append(v)
            for i, layer in enumerate(layers):
                keys[layer], values[layer] = k[i], v[i]
        self.keys, self.values = keys, values
        positions = torch.zeros(rows, capacity, dtype=torch.long, device=self.device)
        positions[: min(rows, self.positions.shape[0]), :keep] = self.positions[:rows, :keep]
        self.positions = positions
        if rows > self.rows:  # the new rows hold zeros
            self.shared = 0
        self.capacity, self.rows = capacity, rows

    def held(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the held keys and values [rows, heads, length, d] (views, in `storage`)."""
        n = self.length
        return [(k[:, :, :n], v[:, :, :n, :-1]) for k, v in zip(self.keys, self.values, strict=True)]

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)
        self.shared = min(self.shared, self.length)

    @torch.inference_mode()
    def select_rows(self, rows: torch.Tensor) -> None:
        """Row i becomes old row rows[i] (rows may repeat, reorder or shrink); only held entries move, and of
        those only the ones past the part every row holds alike (`shared`), unless the row count changes."""
        rows = rows.to(self.device)
        n = self.length
        if rows.numel() == self.rows and bool((rows == torch.arange(self.rows, device=self.device)).all()):
            return
        shared = min(self.shared, n)
        start = shared if rows.numel() == self.rows else 0
        buffers = (*self.key_buffers, *self.value_buffers)
        sources = [b[:, :, :, start:n].index_select(1, rows.to(b.device)) for b in buffers]
        position_sources = self.positions[:, start:n].index_select(0, rows)
        if rows.numel() != self.rows:
            self.key_buffers = self.value_buffers = []
            self.rows = 0
            self.reserve(max(self.capacity, 1), rows=rows.numel())
        for buf, src in zip((*self.key_buffers, *self.value_buffers), sources, strict=True):
            buf[:, :, :, start:n] = src
        self.positions[:, start:n] = position_sources
        # rows copied from one row hold everything alike
        self.shared = n if bool((rows == rows[0]).all()) else shared

    @torch.inference_mode()
    def keep(self, index: torch.Tensor) -> None:
        """Keep the entries `index` ([L], or [rows, L] one list per row), in that order; the leading part
        that stays in place is not copied."""
        index = index.to(self.device)
        length = index.shape[-1]
        same = (index == torch.arange(length, device=self.device)).reshape(-1, length).all(0)
        moved = int(length - int(same.long().cumprod(0).sum()))
        start = length - moved
        self.shared = min(self.shared, start)
        if moved:
            tail = index[..., start:]
            for buf in (*self.key_buffers, *self.value_buffers):  # [layers, rows, heads, capacity, d]
                at = tail.to(buf.device)
                if at.dim() == 1:
                    buf[:, :, :, start:length] = buf.index_select(3, at)
                else:  # per row: gather [layers, rows, heads, moved, d]
                    at = at[None, :, None, :, None].expand(buf.shape[0], -1, buf.shape[2], -1, buf.shape[4])
                    buf[:, :, :, start:length] = buf.gather(3, at)
            if tail.dim() == 1:
                self.positions[:, start:length] = self.positions.index_select(1, tail)
            else:
                self.positions[:, start:length] = self.positions.gather(1, tail)
        self.length = length


class RowKV(StaticKV):
    """Row `row` of a batch's cache (a `StaticKV` of many rows, one sequence each), seen as a one-row cache: views
    of the batch's buffers, so that what a single sequence does with its cache (a prompt's forward, a rollback, a
    tree commit) acts on that row in place. Its capacity is the batch's and does not grow; it holds one row."""

    def __init__(self, batch: StaticKV, row: int):
        self.batch, self.row = batch, row
        self.shapes, self.dtype, self.device, self.storage = batch.shapes, batch.dtype, batch.device, batch.storage
        self.length, self.rows, self.capacity, self.shared = 0, 1, batch.capacity, 0
        self._groups = batch._groups
        self.key_buffers = [b[:, row : row + 1] for b in batch.key_buffers]
        self.value_buffers = [b[:, row : row + 1] for b in batch.value_buffers]
        self.keys = [k[row : row + 1] for k in batch.keys]
        self.values = [v[row : row + 1] for v in batch.values]
        self.positions = batch.positions[row : row + 1]
        self.compiled, self.captured, self.invariant_kind = False, False, None  # a batch's steps run eagerly
        if not hasattr(batch, "views"):
            batch.views = {}
        batch.views[row] = self  # the row's held length, for steps that pad it (`HFModel.forward_rows`)

    def reserve(self, needed: int, rows: int | None = None) -> None:
        if rows not in (None, 1):
            raise ValueError("a sequence in a batch holds one cache row; several-row methods run beside it")
        if needed > self.capacity:
            raise ValueError(f"a sequence in this batch holds at most {self.capacity} entries, {needed} asked for")

    def select_rows(self, rows: torch.Tensor) -> None:
        if rows.numel() != 1 or int(rows[0]) != 0:
            raise ValueError("a sequence in a batch holds one cache row; several-row methods run beside it")
