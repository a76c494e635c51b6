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
    entries only. Reads the keys' positions (sliding windows) from `positions_held` [rows, capacity], which the caller
    has written (`packed_inputs`)."""
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
    minimum = torch.finfo(torch.float32).min
    full = torch.zeros(allowed.shape, dtype=torch.float32, device=device).masked_fill_(~allowed, minimum)[:, None]
    masks = full
    if sliding_window:
        keys = positions_held[:, :span]
        inside = allowed & (keys[:, None, :] > pos[:, :, None] - sliding_window)
        windowed = torch.zeros(inside.shape, dtype=torch.float32, device=device).masked_fill_(~inside, minimum)
        masks = {"full_attention": full, "sliding_attention": windowed[:, None]} if mixed_layers else windowed[:, None]
    return StepInputs(ids, pos, masks, slots, width, 0)


@dataclass
class AttendGroup:
    """Rows of a packed step that attend together (`packed_inputs`): cache rows `rows`, each row's queries
    gathered into a padded [g, w] block. g: rows in the group; w: its widest row's new tokens; K: the keys its
    masks span (its longest row's held entries + w); m: the real queries."""

    rows: slice  # the cache rows attended over: g of them, lo .. hi
    index: torch.Tensor  # [g, w] each query's token in the packed step (padding queries: token 0, output dropped)
    fill: torch.Tensor  # [m] where the real queries sit in the flattened [g * w] block
    tokens: torch.Tensor  # [m] their tokens in the packed step
    masks: torch.Tensor | dict[str, torch.Tensor]  # [g, 1, w, K] additive, or per layer kind
    positions: torch.Tensor  # [g, w] the queries' positions (padding repeats a row's last)
    fused: int = 0  # a prompt's first tokens (one row, nothing held) attended causally by torch's fused kernel


@dataclass
class PackedStep:
    """One forward over many sequences' new tokens packed into one sequence of T tokens (`packed_inputs`): the
    linear maps see [1, T] tokens whatever the rows' widths, and attention runs per group of rows, each row over
    its own cache row. T: the real tokens, then padding up to the step's fewest rows (batch invariance)."""

    ids: torch.Tensor  # [1, T] token ids
    positions: torch.Tensor  # [1, T] position ids
    token_rows: torch.Tensor  # [T] the cache row each token's key and value are written to
    token_slots: torch.Tensor  # [T] ... and the slot (padding tokens: free slots after the last row's new ones)
    groups: list[AttendGroup]
    starts: list[int]  # per feed: its first token in the packed step
    token_mask: torch.Tensor | None = None  # [T, K] each token's additive mask over its row (`token_masks`)

    def token_masks(self) -> torch.Tensor:
        """[T, K] additive float32: each token's view of its own cache row, K the widest group's keys (a padding
        token sees nothing), for attention token by token (`dpbf16.attend_tokens`). Built once per step."""
        if self.token_mask is None:
            widths = [g.masks.shape[-1] for g in self.groups]
            device = self.ids.device
            mask = torch.full((self.ids.shape[1], max(widths)), torch.finfo(torch.float32).min, device=device)
            for g in self.groups:
                flat = g.masks.reshape(-1, g.masks.shape[-1]).to(device)
                mask[g.tokens, : flat.shape[1]] = flat[g.fill]
            self.token_mask = mask
        return self.token_mask


def packed_inputs(
    feeds: list[tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor | None, int]],
    lengths: torch.Tensor,
    fewest: int,
    narrow: int,
    positions_held: torch.Tensor,
    sliding_window: int | None,
    mixed_layers: bool,
) -> PackedStep:
    """The packed step of `feeds` (row, held entries, tokens [n], positions [n], bool mask [n, held + n] or None:
    causal, fused: a prompt's first tokens for torch's fused attention) over a batch cache whose rows hold
    `lengths` [R] entries, padded to at least `fewest` tokens. Rows with no more than `narrow` new tokens and
    entries held attend in one group over rows 0 .. R - 1 (a row without a feed is padding there); each other
    row (a prompt's chunk) attends alone. Writes the positions into `positions_held` [R, capacity]."""
    device = positions_held.device
    rows = lengths.numel()
    counts = [int(f[2].numel()) for f in feeds]
    real = sum(counts)
    total = max(real, fewest)
    starts = [0]
    for n in counts[:-1]:
        starts.append(starts[-1] + n)
    ids = torch.cat([f[2].reshape(-1) for f in feeds])
    pos = torch.cat([f[3].reshape(-1) for f in feeds])
    token_rows = torch.cat([torch.full((n,), f[0], dtype=torch.long) for f, n in zip(feeds, counts, strict=True)])
    token_slots = torch.cat([torch.arange(f[1], f[1] + n) for f, n in zip(feeds, counts, strict=True)])
    if total > real:  # padding: the last feed's row, in the free slots after its new entries; seen by nobody
        last_row, last_end = feeds[-1][0], feeds[-1][1] + counts[-1]
        pad = total - real
        ids = torch.cat([ids, ids.new_zeros(pad)])
        pos = torch.cat([pos, pos[-1:].expand(pad)])
        token_rows = torch.cat([token_rows, torch.full((pad,), last_row, dtype=torch.long)])
        token_slots = torch.cat([token_slots, torch.arange(last_end, last_end + pad)])
    positions_held[token_rows.to(device), token_slots.to(device)] = pos.to(device)
    groups = []
    together = [i for i, f in enumerate(feeds) if f[1] > 0 and counts[i] <= narrow]
    if together:
        width = max(counts[i] for i in together)
        given = [(feeds[i][0], feeds[i][2].reshape(-1), feeds[i][3].reshape(-1), feeds[i][4]) for i in together]
        block = row_inputs(rows, lengths, given, width, positions_held[:rows], sliding_window, mixed_layers)
        index = torch.zeros(rows, width, dtype=torch.long)
        fill, tokens = [], []
        for i in together:
            row, n = feeds[i][0], counts[i]
            index[row, :n] = torch.arange(starts[i], starts[i] + n)
            fill.append(torch.arange(row * width, row * width + n))
            tokens.append(torch.arange(starts[i], starts[i] + n))
        groups.append(
            AttendGroup(
                slice(0, rows),
                index.to(device),
                torch.cat(fill).to(device),
                torch.cat(tokens).to(device),
                block.masks,
                block.positions,
            )
        )
    for i, (row, held, tokens, positions, mask, fused) in enumerate(feeds):
        if i in together:
            continue
        n = counts[i]
        block = row_inputs(
            1,
            lengths[row : row + 1],
            [(0, tokens.reshape(-1), positions.reshape(-1), mask)],
            n,
            positions_held[row : row + 1],
            sliding_window,
            mixed_layers,
        )
        span = torch.arange(starts[i], starts[i] + n)
        groups.append(
            AttendGroup(
                slice(row, row + 1),
                span[None].to(device),
                torch.arange(n, device=device),
                span.to(device),
                block.masks,
                block.positions,
                fused if held == 0 and not sliding_window else 0,
            )
        )
    return PackedStep(
        ids[None].to(device),
        pos[None].to(device),
        token_rows.to(device),
        token_slots.to(device),
        groups,
        starts,
    )
