"""One static-cache step's inputs, as the model's forward takes them: the new tokens padded to the step's width,
their positions, the additive masks over the cache and the slots the step writes."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepInputs:
    """A step over `n` new tokens after `past` cached ones, padded to `width` (a bucket for a compiled or captured
    step; enough rows for batch invariance eagerly). B: rows; K: the keys the masks span (past + width, or the
    cache's capacity for a captured step, whose shapes stay fixed as the cache fills)."""

    ids: torch.Tensor  # [B, width] token ids, padding after the n real ones
    positions: torch.Tensor  # [B, width] position ids (padding repeats the last real one)
    masks: torch.Tensor | dict[str, torch.Tensor]  # [B, 1, width, K] additive (0 where allowed), or per layer kind
    slots: torch.Tensor  # [width] the cache slots written: past .. past + width
    n: int  # real new tokens
    past: int  # cached tokens before the step

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    def args(self, cache) -> tuple:
        """The arguments of a compiled or captured step (`HFModel.step`'s, without the keyword options)."""
        return self.ids, self.positions, self.masks, self.slots, cache.keys, cache.values


def step_inputs(
    cache,
    tokens: torch.Tensor,
    positions: torch.Tensor | None,
    mask: torch.Tensor | None,
    width: int,
    span: int,
    sliding_window: int | None,
    mixed_layers: bool,
    copy: bool,
) -> StepInputs:
    """The inputs of a step feeding `tokens` [B, n] (at `positions` [B, n], default: after the cache; under `mask`
    [B, n, past + n] bool, default: causal) padded to `width`, with masks over `span` keys. `copy`: fresh ids and
    positions even when unpadded (a compiled graph is guarded on its inputs' strides). Writes the positions into
    the cache's."""
    device = cache.positions.device
    b, n = tokens.shape
    past = cache.length
    total = past + width
    new = positions.to(device) if positions is not None else torch.arange(past, past + n, device=device).expand(b, n)
    if width == n and not copy:
        pos, ids = new, tokens.to(device)
    else:
        pos = torch.empty(b, width, dtype=torch.long, device=device)
        pos[:, :n] = new
        pos[:, n:] = new[:, -1:]
        ids = torch.zeros(b, width, dtype=torch.long, device=device)
        ids[:, :n] = tokens.to(device)
    cache.positions[:, past:total] = pos
    minimum = torch.finfo(torch.float32).min
    if mask is None and not sliding_window:
        # a causal chain, the common step, in two operators: padding rows see causally too (their outputs are
        # dropped, and no real row sees them)
        full = torch.full((width, span), minimum, device=device).triu_(past + 1)[None, None].expand(b, 1, -1, -1)
        return StepInputs(ids, pos, full, torch.arange(past, total, device=device), n, past)
    allowed = torch.zeros(b, width, span, dtype=torch.bool, device=device)
    if mask is None:
        allowed[:, :n, :past] = True
        allowed[:, :n, past : past + n] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    else:
        allowed[:, :n, : past + n] = mask.to(device)
    pad = torch.arange(n, width, device=device)
    allowed[:, pad, past + pad] = True  # padding sees only itself
    full = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill_(~allowed, minimum)[:, None]
    masks = full
    if sliding_window:
        keys = cache.positions[:, :span]
        inside = allowed & (keys[:, None, :] > pos[:, :, None] - sliding_window)
        windowed = torch.zeros(inside.shape, dtype=torch.float32, device=device).masked_fill_(~inside, minimum)
        windowed = windowed[:, None]
        masks = {"full_attention": full, "sliding_attention": windowed} if mixed_layers else windowed
    return StepInputs(ids, pos, masks, torch.arange(past, total, device=device), n, past)


def row_inputs(
    rows: int,
    lengths: torch.Tensor,
    feeds: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor | None]],
    width: int,
    positions_held: torch.Tensor,
    sliding_window: int | None,
    mixed_layers: bool,
) -> StepInputs:
    """The inputs of one step over cache rows 0 .. `rows` - 1 of a batch, each row a sequence of its own
    `lengths` [rows] entries: `feeds` (row, tokens [n], positions [n], bool mask [n, length + n] or None:
    causal) give a row its new tokens; every row's are padded to `width`, and a row without a feed gets padding
    only. Each row writes at its own slots (length .. length + width: past its held entries), and sees its own
    entries only. Writes the positions into `positions_held` [rows, capacity] (the batch cache's)."""
    device = positions_held.device
    counts = torch.zeros(rows, dtype=torch.long)
    ids = torch.zeros(rows, width, dtype=torch.long)
    pos = lengths[:, None].expand(rows, width).clone()
    custom = []
    for row, tokens, positions, mask in feeds:
        n = tokens.shape[-1]
        counts[row] = n
        ids[row, :n] = tokens
        pos[row, :n] = positions
        pos[row, n:] = positions[-1]
        if mask is not None:
            custom.append((row, n, mask))
    span = int(lengths.max()) + width
    col = torch.arange(span)[None, None, :]
    i = torch.arange(width)[None, :, None]
    held = lengths[:, None, None]
    # causal by default: a row's held entries, then its new tokens up to each; padding sees only itself
    allowed = torch.where(i >= counts[:, None, None], col == held + i, col <= held + i)
    for row, n, mask in custom:
        allowed[row, :n, : int(lengths[row]) + n] = mask
    slots = (lengths[:, None] + torch.arange(width)[None, :]).to(device)
    ids, pos, allowed = ids.to(device), pos.to(device), allowed.to(device)
    positions_held.scatter_(1, slots, pos)
    minimum = torch.finfo(torch.float32).min
    full = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill_(~allowed, minimum)[:, None]
    masks = full
    if sliding_window:
        keys = positions_held[:, :span]
        inside = allowed & (keys[:, None, :] > pos[:, :, None] - sliding_window)
        windowed = torch.zeros(inside.shape, dtype=torch.float32, device=device).masked_fill_(~inside, minimum)
        masks = {"full_attention": full, "sliding_attention": windowed[:, None]} if mixed_layers else windowed[:, None]
    return StepInputs(ids, pos, masks, slots, width, 0)
