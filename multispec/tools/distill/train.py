"""Distillation: the draft learns the target's next-token distributions along the target's own answers.

Loss: KL(target || draft) over the (top-K + tail) coarsening of each target distribution kept by
`teacher.py`, at every answer position. Checkpoints (model, optimiser, step) are written atomically
every `checkpoint_every` steps together with an ordinary transformers checkpoint of the draft, so an
interrupted run loses at most that many steps and `resume=True` continues from the last one.

Held-out evaluation (printed as training goes, and logged to `log.jsonl`): on answers to prompts kept
out of training, against the *full* target distribution: 1 - TV at temperature 1, greedy agreement
(same argmax) and the coarse KL.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch


@dataclass
class TrainConfig:
    steps: int = 1500
    minutes: float | None = None  # also stop after this much training time (the schedule follows the clock)
    batch_tokens: int = 2048  # answer positions per step
    lr: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.01
    eval_every: int = 100
    checkpoint_every: int = 100
    seed: int = 0
    max_length: int = 512
    dtype: str = "bfloat16"  # matrix products of training steps under autocast; "float32" for none. On a CPU with
    # bfloat16 instructions this trains faster with the same losses (measured on the shipped draft's training);
    # the held-out evaluation always runs in float32


def coarse_kl(draft_logits: torch.Tensor, top_idx: torch.Tensor, top_logp: torch.Tensor) -> torch.Tensor:
    """Per-position KL(target || draft) over the buckets {top-K tokens of the target} + {the rest}. `top_idx` are
    columns of `draft_logits`; -1: a token the draft cannot propose (a reduced draft vocabulary), counted in the
    rest."""
    logq = torch.log_softmax(draft_logits.float(), -1)
    kept = top_idx >= 0
    q_top = torch.where(kept, logq.gather(-1, top_idx.clamp_min(0)), 0.0)
    p_top = top_logp.exp() * kept
    p_tail = (1 - p_top.sum(-1)).clamp_min(0)
    q_tail = torch.log((1 - (q_top.exp() * kept).sum(-1)).clamp_min(1e-9))
    p_tail_log = torch.log(p_tail.clamp_min(1e-9))
    return (p_top * (top_logp - q_top)).sum(-1) + p_tail * (p_tail_log - q_tail)


def _batches(rows: list[dict], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    order = list(range(len(rows)))
    random.Random(seed * 1000 + epoch).shuffle(order)
    out, cur, n = [], [], 0
    for i in order:
        cur.append(i)
        n += len(rows[i]["ids"])
        if n >= batch_tokens:
            out.append(cur)
            cur, n = [], 0
    if cur and not out:  # fewer answer tokens than one batch: train on what there is (else no step ever runs)
        out.append(cur)
    return out


def _forward(draft, rows: list[dict], max_length: int, dtype: str = "float32"):
    """Draft logits at every answer position of `rows` (right-padded batch), with the targets' top-K;
    the draft's products run in `dtype` (autocast) unless it is float32."""
    seqs, spans = [], []
    for r in rows:
        seq = torch.cat([r["prompt_ids"], r["ids"]]).long()[:max_length]
        p = len(r["prompt_ids"])
        n = min(len(r["ids"]), len(seq) - p)
        seqs.append(seq)
        spans.append((p, n))
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    device = draft.device
    with torch.autocast(device.type, dtype=getattr(torch, dtype), enabled=dtype != "float32"):
        hidden = draft.model(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
        # position p - 1 + j predicts answer token j
        picked = torch.cat([hidden[i, p - 1 : p - 1 + n] for i, (p, n) in enumerate(spans)])
        logits = draft.lm_head(picked)
    top_idx = torch.cat([r["top_idx"][:n] for r, (_, n) in zip(rows, spans, strict=True)]).long().to(device)
    top_logp = torch.cat([r["top_logp"][:n] for r, (_, n) in zip(rows, spans, strict=True)]).float().to(device)
    return logits, top_idx, top_logp


@torch.inference_mode()
def target_eval_probs(target, rows: list[dict], max_length: int = 512) -> list[torch.Tensor]:
    """The full target distribution (temperature 1) at every answer position of the held-out rows."""
    out = []
    for r in rows:
        seq = torch.cat([r["prompt_ids"], r["ids"]]).long()[:max_length]
        p = len(r["prompt_ids"])
        logits = target.forward(target.new_cache(), seq[None].to(target.device))[0]
        out.append(torch.softmax(logits[p - 1 : len(seq) - 1].float().cpu(), -1).to(torch.float16))
    return out


@torch.no_grad()
def evaluate(
    draft, rows: list[dict], target_probs: list[torch.Tensor], max_length: int = 512, forward=None, columns=None
) -> dict:
    """Held-out 1 - TV, greedy agreement and coarse KL against the target's distributions. `forward` and `columns`:
    as `train` takes them."""
    forward = forward or partial(_forward, draft)
    draft.eval()
    tv_sum = agree = kl_sum = n_total = 0.0
    for r, probs in zip(rows, target_probs, strict=True):
        logits, top_idx, top_logp = forward([r], max_length)
        n = min(len(logits), len(probs))
        target = probs[:n].float().to(logits.device)
        q = torch.softmax(logits[:n].float(), -1)
        if columns is not None:  # a reduced vocabulary's columns, placed among the target's ids
            q = torch.zeros_like(target).index_copy_(-1, columns.to(q.device), q)
        tv_sum += float(0.5 * (target - q).abs().sum(-1).sum())
        agree += float((target.argmax(-1) == q.argmax(-1)).sum())
        kl_sum += float(coarse_kl(logits[:n], top_idx[:n], top_logp[:n]).sum())
        n_total += n
    draft.train()
    return {
        "one_minus_tv": 1 - tv_sum / n_total,
        "greedy_agreement": agree / n_total,
        "coarse_kl": kl_sum / n_total,
        "positions": int(n_total),
    }


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def export(draft, tokenizer, folder: Path) -> None:
    """An ordinary transformers checkpoint (config + safetensors + tokenizer), written atomically."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    draft.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)


def train(
    draft,
    tokenizer,
    train_rows: list[dict],
    eval_rows: list[dict],
    eval_probs: list[torch.Tensor],
    out: Path,
    cfg: TrainConfig,
    resume: bool = False,
    say=print,
    progress=None,
    more_evals: dict[str, tuple[list[dict], list[torch.Tensor]]] | None = None,
    forward=None,
    columns: torch.Tensor | None = None,
    save=None,
) -> dict:
    """Train `draft` on the teacher rows, with checkpoints (resumable) and held-out evaluations.

    `more_evals` names further held-out sets (rows, target probabilities), logged as `eval_<name>_*`. A draft that
    is not a transformers causal LM (a feature-level head) brings `forward(rows, max_length, dtype=...)` -> (logits
    [N, C], the target's top-K as columns of them (-1: none) [N, K], their log-probabilities [N, K]), `columns`
    (the target id of each of the C columns; None: C is the target's vocabulary) and `save(folder)`, its export.
    """
    forward = forward or partial(_forward, draft)
    save = save or partial(export, draft, tokenizer)
    if not train_rows:
        raise ValueError("no teacher answers to train on (every answer was empty)")
    if cfg.dtype not in ("bfloat16", "float32"):
        raise ValueError(f"training dtype must be bfloat16 or float32, got {cfg.dtype!r}")
    torch.manual_seed(cfg.seed)
    params = [p for p in draft.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)

    def progress_of(step: int, seconds: float) -> float:  # the share of the budget (steps or time) used
        by_time = seconds / (60 * cfg.minutes) if cfg.minutes else 0.0
        return max(step / cfg.steps, by_time)

    def lr_at(step: int, seconds: float) -> float:  # linear warm-up, cosine down to a tenth
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        frac = min(1.0, progress_of(step, seconds))
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    ckpt_path, log_path = out / "checkpoint.pt", out / "log.jsonl"
    step, spent = 0, 0.0  # spent: training seconds of earlier runs of this folder
    if resume and ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        draft.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        step, spent = state["step"], state.get("seconds", 0.0)
        say(f"resumed at step {step} from {ckpt_path}")
    elif log_path.exists():
        log_path.unlink()

    def log(entry: dict) -> None:
        with log_path.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def evaluations() -> tuple[dict, str]:
        ev = evaluate(draft, eval_rows, eval_probs, cfg.max_length, forward, columns)
        entry = {f"eval_{k}": v for k, v in ev.items()}
        text = (
            f"held-out 1-TV {ev['one_minus_tv']:.3f}, greedy agreement {ev['greedy_agreement']:.3f}, "
            f"KL {ev['coarse_kl']:.3f}"
        )
        for name, (rows, probs) in (more_evals or {}).items():
            more = evaluate(draft, rows, probs, cfg.max_length, forward, columns)
            entry |= {f"eval_{name}_{k}": v for k, v in more.items()}
            text += f"; {name}: 1-TV {more['one_minus_tv']:.3f}, agreement {more['greedy_agreement']:.3f}"
        return entry, text

    if step == 0:
        entry, text = evaluations()
        log({"step": 0, "tokens": 0, "seconds": 0.0, **entry})
        say(f"step 0: {text}")

    draft.train()
    epoch, batches = 0, _batches(train_rows, cfg.batch_tokens, cfg.seed, 0)
    seen = step  # fast-forward the deterministic batch order to where a resumed run stopped
    while seen >= len(batches):
        seen -= len(batches)
        epoch += 1
        batches = _batches(train_rows, cfg.batch_tokens, cfg.seed, epoch)
    position = seen
    t0, tokens, losses = time.perf_counter(), 0, []
    last = {}
    while progress_of(step, spent + time.perf_counter() - t0) < 1:
        if position >= len(batches):
            epoch, position = epoch + 1, 0
            batches = _batches(train_rows, cfg.batch_tokens, cfg.seed, epoch)
        rows = [train_rows[i] for i in batches[position]]
        position += 1
        for group in optim.param_groups:
            group["lr"] = lr_at(step, spent + time.perf_counter() - t0)
        logits, top_idx, top_logp = forward(rows, cfg.max_length, dtype=cfg.dtype)
        loss = coarse_kl(logits, top_idx, top_logp).mean()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optim.step()
        step += 1
        tokens += len(logits)
        losses.append(loss.item())
        if progress is not None:
            progress(step, cfg.steps, losses[-1])
        finished = progress_of(step, spent + time.perf_counter() - t0) >= 1
        if step % cfg.eval_every == 0 or finished:
            entry, text = evaluations()
            seconds = time.perf_counter() - t0
            last = {
                "step": step,
                "epoch": epoch,
                "train_kl": sum(losses) / len(losses),
                "tokens": tokens,
                "seconds": spent + seconds,
                "tokens_per_second": tokens / seconds,
                **entry,
            }
            log(last)
            losses = []
            say(f"step {step}: train KL {last['train_kl']:.3f}; {text}")
        if step % cfg.checkpoint_every == 0 or finished:
            _save_atomic(
                {
                    "model": draft.state_dict(),
                    "optim": optim.state_dict(),
                    "step": step,
                    "seconds": spent + time.perf_counter() - t0,
                    "config": asdict(cfg),
                },
                ckpt_path,
            )
            save(out / "draft")
    return last
