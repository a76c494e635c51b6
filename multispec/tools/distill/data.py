"""The teacher data of a distillation run: the target's answers to the training and held-out prompts (shards
written by `teacher.py`), the token counts of its answers, and the copy of the target that writes them."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .prompts import Contamination, prompt_pool
from .teacher import build_dataset, existing_shards, load_rows, self_written_prompts
from .train import target_eval_probs

if TYPE_CHECKING:
    from . import DistillConfig


@dataclass
class TeacherData:
    """The target's answers to the training prompts and to the held-out ones, with what evaluations need."""

    train_rows: list[dict]
    eval_rows: list[dict]
    eval_probs: list[torch.Tensor]  # the target's whole distribution at each held-out answer position
    more_evals: dict  # further held-out sets by name: (rows, probabilities)
    teacher: object  # the model that wrote the answers (the target, or its copy in the teacher dtype)


def teacher_data(target, out: Path, cfg: DistillConfig, data_dir: Path, say, bar=None) -> TeacherData:
    """Generate (or reuse: finished shards are kept) the teacher data of a run in `out`."""
    extra = []
    for folder in cfg.extra_data:
        shards = existing_shards(Path(folder))
        if not shards:
            raise ValueError(f"--extra-data {folder} holds no teacher shards (shard-*.pt)")
        extra += shards
    extra_rows = load_rows(extra)
    if extra_rows:
        # earlier runs' pools may have held prompts that copy MT-Bench's wording: keep those out
        contaminated = Contamination.mt_bench(data_dir)
        kept = [r for r in extra_rows if not contaminated(target.tokenizer.decode(r["prompt_ids"].tolist()))]
        say(
            f"extra data: {len(kept)} answers from {len(extra)} shards ({len(extra_rows) - len(kept)} dropped: "
            "their prompts share wording with MT-Bench)"
        )
        extra_rows = kept

    teacher = _teacher(target, cfg.teacher_dtype)
    # prompts the extra data already answers are not asked again, and cannot be held out
    answered = {tuple(r["prompt_ids"].tolist()) for r in extra_rows}
    pool = prompt_pool(data_dir, seed=cfg.train.seed)
    if answered:  # tokenising the whole pool is only needed to match it against extra data
        pool = [p for p in pool if tuple(target.encode(p, chat=True)) not in answered]
    if len(pool) < cfg.prompts + cfg.heldout_prompts:
        raise ValueError(
            f"the prompt pool has {len(pool)} prompts not answered by --extra-data, fewer than "
            f"--prompts {cfg.prompts} + {cfg.heldout_prompts} held out"
        )
    train_prompts = pool[: cfg.prompts]
    heldout = pool[cfg.prompts : cfg.prompts + cfg.heldout_prompts]
    heldout_self = []
    if cfg.self_prompts:
        # as many more are written and held out: the pool's held-out set does not track the chat
        # distribution these prompts aim at
        written = _self_prompts(teacher, out / "self-prompts.json", cfg, data_dir, say, bar)
        train_prompts += written[: cfg.self_prompts]
        heldout_self = written[cfg.self_prompts :]

    gen_progress = _progress(say, bar)

    train_paths = build_dataset(
        teacher,
        train_prompts,
        out / "data",
        cfg.gen_batch,
        cfg.max_new_tokens,
        seed=cfg.train.seed,
        progress=gen_progress("teacher answers"),
    )
    held_paths = build_dataset(
        teacher,
        heldout,
        out / "heldout",
        cfg.gen_batch,
        cfg.max_new_tokens,
        seed=cfg.train.seed + 10_000,
        progress=gen_progress("held-out answers"),
    )
    self_paths = (
        build_dataset(
            teacher, heldout_self, out / "heldout-self", cfg.gen_batch, cfg.max_new_tokens, seed=cfg.train.seed + 30_000
        )
        if heldout_self
        else []
    )
    train_rows, eval_rows = load_rows(train_paths) + extra_rows, load_rows(held_paths)
    self_rows = load_rows(self_paths)
    n_tokens = sum(len(r["ids"]) for r in train_rows)
    say(
        f"teacher data: {len(train_rows)} answers, {n_tokens} tokens; held out: {len(eval_rows)} answers"
        + (f", and {len(self_rows)} to self-written prompts" if self_rows else "")
    )
    eval_probs = target_eval_probs(target, eval_rows, cfg.train.max_length)
    more_evals = {"self": (self_rows, target_eval_probs(target, self_rows, cfg.train.max_length))} if self_rows else {}
    return TeacherData(train_rows, eval_rows, eval_probs, more_evals, teacher)


def _progress(say, bar):
    """Progress of generation by label: the bar's, or a line per batch."""

    def gen_progress(label):
        return (lambda i, n, path: i and say(f"{label}: batch {i}/{n} ready")) if bar is None else bar(label)

    return gen_progress


def answer_counts(rows: list[dict], vocab: int) -> torch.Tensor:
    """How often each token id occurs in the answers of teacher rows: [vocab] int64."""
    counts = torch.zeros(vocab, dtype=torch.int64)
    for row in rows:
        ids = row["ids"].long()
        counts += torch.bincount(ids[ids < vocab], minlength=vocab)
    return counts


def _teacher(target, dtype: str):
    """The model that writes and answers the training prompts: the target, or a copy of it in `dtype`."""
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"teacher dtype must be bfloat16 or float32, got {dtype!r}")
    if dtype == "float32" or getattr(target, "dtype", None) == getattr(torch, dtype):
        return target
    from ...models.hf import HFModel

    model = copy.deepcopy(target.model).to(getattr(torch, dtype))
    return HFModel(model, target.tokenizer, name=f"{target.name} ({dtype})", chat=target.use_chat_template)


def _self_prompts(target, path: Path, cfg: DistillConfig, data_dir: Path, say, bar=None) -> list[str]:
    """The target's own prompts (`self_prompts` for training, then `heldout_prompts` to hold out), written
    once per run folder and saved after every batch (an interrupted run continues the writing; a resumed
    one answers the same prompts)."""
    wanted = cfg.self_prompts + cfg.heldout_prompts
    state = json.loads(path.read_text()) if path.exists() else {}
    if not state.get("done"):
        contaminated = Contamination.mt_bench(data_dir)
        update = bar("self-written prompts") if bar is not None else None

        def save(s: dict) -> None:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(s, indent=0))
            os.replace(tmp, path)
            if update is not None:
                update(min(len(s["prompts"]), wanted), wanted)

        prompts = self_written_prompts(
            target,
            wanted,
            cfg.gen_batch,
            seed=cfg.train.seed + 20_000,
            keep=lambda text: not contaminated(text),
            state=state,
            on_batch=save,
        )
        state = {"done": True, "prompts": prompts}
        save(state)
    say(
        f"self-written prompts: {len(state['prompts'])} (of {wanted} asked: {cfg.self_prompts} to train on, "
        f"{cfg.heldout_prompts} to hold out), in {path}"
    )
    return state["prompts"]
