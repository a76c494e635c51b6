"""Training a feature-level draft head for a target (`multispec distill --kind eagle`; the head: `models.eagle`).

    data      the target's answers to the training prompts (the teacher shards every distill run writes)
    features  the target's hidden states at the head's layers, over each prompt and answer (extra data included),
              from one forward per batch, kept in features/ (bfloat16; resumable)
    head      one decoder layer of the target's shape, the target's embeddings (shared, not trained), its final norm
              and the head rows of the draft vocabulary (the `draft_vocab` tokens the answers hold most) to start
    train     KL to the target's distributions at every answer position (the loop of `train.py`: checkpoints,
              resume, held-out evaluation), with the target's features as input; then a second pass in which
              each position reads the head's own output at the position before, as it does when it drafts the
              second token of a chain

Output: eagle/ (the head in the speculators layout, `multispec generate --draft OUT/eagle`), checkpoint.pt,
log.jsonl.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import torch

from ...models.eagle import default_layers, new_head, save_eagle
from ...models.vocab import save_token_counts, top_ids
from .data import answer_counts, teacher_data
from .train import train


@torch.inference_mode()
def target_features(target, rows: list[dict], layers: tuple[int, ...], max_length: int, batch: int = 8):
    """The inputs of the target's `layers` at every position of each row's prompt and answer (cut to `max_length`),
    concatenated: one [T, len(layers) x hidden] bfloat16 tensor per row."""
    out = []
    for start in range(0, len(rows), batch):
        seqs = [torch.cat([r["prompt_ids"], r["ids"]]).long()[:max_length] for r in rows[start : start + batch]]
        width = max(len(x) for x in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, x in enumerate(seqs):  # right-padded: every row's positions are 0, 1, ...
            ids[i, : len(x)], mask[i, : len(x)] = x, 1
        with target.hidden_features(layers) as seen:
            target.model.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device))
        features = torch.cat(seen, -1)
        out += [features[i, : len(x)].to("cpu", torch.bfloat16) for i, x in enumerate(seqs)]
    return out


def with_features(
    target, rows: list[dict], folder: Path, layers: tuple[int, ...], max_length: int, chunk: int, progress=None
) -> list[dict]:
    """`rows`, each with its `features`: computed `chunk` rows at a time and kept in `folder` (a resumed run reads
    them back; a kept chunk whose rows' lengths differ from these rows' is computed again)."""
    out = []
    starts = range(0, len(rows), chunk)
    for i, start in enumerate(starts):
        part = rows[start : start + chunk]
        lengths = [min(max_length, len(r["prompt_ids"]) + len(r["ids"])) for r in part]
        path = folder / f"shard-{i:05d}.pt"
        kept = torch.load(path) if path.exists() else None
        if kept is not None and kept["lengths"] == lengths:
            features = kept["features"]
        else:
            features = target_features(target, part, layers, max_length)
            folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save({"lengths": lengths, "features": features}, tmp)
            os.replace(tmp, path)
        out += [{**row, "features": f} for row, f in zip(part, features, strict=True)]
        if progress is not None:
            progress(i + 1, len(starts))
    return out


def head_forward(head, to_draft: torch.Tensor, rows: list[dict], max_length: int, dtype: str = "float32", unroll=1):
    """The head's logits at every answer position of `rows` (right-padded batch), over its draft vocabulary.

    Pass 1 reads the target's features (entry p: the target's after p - 1); pass k > 1 reads, at each position, the
    head's own output of pass k - 1 at the position before, and attends to pass 1's keys before it and its own:
    what it sees when it drafts the k-th token of a chain. `unroll`: the passes, whose logits are stacked.

    Returns (logits [N, draft_vocab], the target's top-K as draft ids (-1: outside the draft vocabulary) [N, K],
    their log-probabilities [N, K]).
    """
    seqs, spans = [], []
    for r in rows:
        seq = torch.cat([r["prompt_ids"], r["ids"]]).long()[:max_length]
        p = len(r["prompt_ids"])
        seqs.append((seq, r["features"][: len(seq)]))
        spans.append((p, min(len(r["ids"]), len(seq) - p)))
    b, width = len(seqs), max(len(s) for s, _ in seqs)
    device = next(head.parameters()).device
    ids = torch.zeros(b, width, dtype=torch.long)
    feats = torch.zeros(b, width, seqs[0][1].shape[-1])
    lengths = torch.tensor([len(s) for s, _ in seqs])
    for i, (s, f) in enumerate(seqs):
        ids[i, : len(s)], feats[i, : len(s)] = s, f.float()
    ids, feats = ids.to(device), feats.to(device)
    layer = head.layer
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    valid = (torch.arange(width)[None] < lengths[:, None]).to(device)
    mask = causal[None] & valid[:, None, :]  # [B, W, W]
    positions = torch.arange(width, device=device).expand(b, width)
    empty = torch.zeros(b, 0, layer.kv_heads, layer.head_dim, device=device)
    passes = []
    with torch.autocast(device.type, dtype=getattr(torch, dtype), enabled=dtype != "float32"):
        mapped = head.read_target(feats)
        features = torch.cat([torch.zeros_like(mapped[:, :1]), mapped[:, :-1]], 1)
        out, _, keys, values = head.step(ids, features, positions, empty, empty, mask, logits=False)
        passes.append(out)
        eye = torch.eye(width, dtype=torch.bool, device=device).expand(b, -1, -1)
        for k in range(2, unroll + 1):
            # position p reads its own output at p - 1; keys: pass 1's strictly before p - k + 2 (the committed
            # entries a k-th draft sees), then this pass's own at p
            features = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], 1)
            seen = torch.ones(width, width, dtype=torch.bool, device=device).tril(-(k - 1))[None] & valid[:, None, :]
            step_mask = torch.cat([seen, eye], -1)
            out, _, _, _ = head.step(ids, features, positions, keys, values, step_mask, logits=False)
            passes.append(out)
        # entry p - 1 + j predicts answer token j: the head's output rows are made for those entries only
        picked = [
            head.logits_of(torch.cat([h[i, p - 1 : p - 1 + n] for i, (p, n) in enumerate(spans)])) for h in passes
        ]
    top_idx = torch.cat([r["top_idx"][:n] for r, (_, n) in zip(rows, spans, strict=True)]).long()
    top_logp = torch.cat([r["top_logp"][:n] for r, (_, n) in zip(rows, spans, strict=True)]).float()
    k = len(picked)
    top = to_draft.to(device)[top_idx.to(device)]
    return torch.cat(picked), top.repeat(k, 1), top_logp.to(device).repeat(k, 1)


def distill_eagle(target, out: Path, cfg, data_dir: Path, resume: bool, say, bar) -> dict:
    """`distill` for `cfg.kind == "eagle"` (module note); returns the last evaluation."""
    if not hasattr(target, "hidden_features"):
        raise ValueError(f"{target.name} does not expose its hidden states: no feature-level head can be trained")
    data = teacher_data(target, out, cfg, data_dir, say, bar)
    layers = default_layers(target.model.config.num_hidden_layers)
    progress = None if bar is None else bar("target features")
    features, length = out / "features", cfg.train.max_length
    train_rows = with_features(target, data.train_rows, features / "data", layers, length, cfg.gen_batch, progress)
    eval_rows = with_features(target, data.eval_rows, features / "heldout", layers, length, cfg.gen_batch)
    eval_probs = data.eval_probs
    counts = answer_counts(train_rows, target.vocab_size)
    vocab = min(cfg.draft_vocab, target.vocab_size)
    ids = top_ids(counts, vocab, always=target.stop_tokens)
    if cfg.unroll not in (1, 2):
        raise ValueError(f"unroll must be 1 or 2 passes, got {cfg.unroll}")
    head = new_head(target, ids, seed=cfg.train.seed).float()
    base = target.model
    with torch.no_grad():  # start from the target's own output: its final norm and the kept rows of its head
        head.lm_head.weight.copy_(base.get_output_embeddings().weight[ids.to(target.device)].float())
        head.norm.weight.copy_(base.model.norm.weight.float())
    to_draft = torch.full((target.vocab_size,), -1, dtype=torch.long)
    to_draft[ids] = torch.arange(ids.numel())
    n_params = sum(p.numel() for p in head.parameters())
    say(
        f"head: reads layers {list(layers)} of {target.name}, draft vocabulary {vocab} "
        f"(holds {float(counts[ids].sum() / counts.sum()):.3f} of the answers' tokens), {n_params / 1e6:.1f} M "
        "parameters besides the shared embeddings"
    )

    def save(folder: Path) -> None:
        save_eagle(head, folder, verifier=target.name)
        save_token_counts(folder, counts, "the target's training answers")

    last = train(
        head,
        None,
        train_rows,
        eval_rows,
        eval_probs,
        out,
        cfg.train,
        resume=resume,
        say=say,
        progress=None if bar is None else bar("training"),
        forward=partial(head_forward, head, to_draft, unroll=cfg.unroll),
        columns=ids,
        save=lambda _: save(out / "eagle"),
    )
    save(out / "eagle")
    say(f"head saved to {out / 'eagle'}: multispec generate --draft {out / 'eagle'}")
    return last
