"""Draft training by distillation (`multispec distill`).

    data     the target answers a prompt pool (teacher.py, prompts.py), keeping its distributions
    model    a narrow Llama initialised from the target's embeddings (model.py)
    train    KL to the target's distributions, checkpoints, resume, held-out evaluation (train.py)
    eval     acceptance measures of any pair on held-out MT-Bench prompts (evaluate.py)

Output folder layout: data/ and heldout/ (teacher shards), checkpoint.pt, log.jsonl (training curve),
draft/ (an ordinary transformers checkpoint of the draft, with the target's tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .model import build_draft, draft_config
from .prompts import default_data_dir, mt_bench_prompts, prompt_pool
from .teacher import build_dataset, load_rows
from .train import TrainConfig, export, target_eval_probs, train

__all__ = ["DistillConfig", "TrainConfig", "build_draft", "draft_config", "distill", "mt_bench_prompts", "prompt_pool"]


@dataclass
class DistillConfig:
    prompts: int = 768  # training prompts taken from the pool
    heldout_prompts: int = 32  # pool prompts answered for the evaluation printed during training
    gen_batch: int = 32
    max_new_tokens: int = 160
    hidden: int = 224
    layers: int = 5
    heads: int = 4
    kv_heads: int = 2
    train: TrainConfig = field(default_factory=TrainConfig)


def distill(target, out: Path, cfg: DistillConfig, data_dir: Path | None = None, resume: bool = False,
            say=print, bar=None) -> dict:
    """Generate (or reuse) the teacher data, build the draft, train it; returns the last evaluation."""
    out.mkdir(parents=True, exist_ok=True)
    if (out / "checkpoint.pt").exists() and not resume:
        raise ValueError(f"{out} already holds a training run; pass --resume to continue it or choose another --out")
    data_dir = data_dir or default_data_dir()
    pool = prompt_pool(data_dir, seed=cfg.train.seed)
    if len(pool) < cfg.prompts + cfg.heldout_prompts:
        raise ValueError(f"the prompt pool has {len(pool)} prompts, fewer than --prompts {cfg.prompts} "
                         f"+ {cfg.heldout_prompts} held out")
    train_prompts = pool[: cfg.prompts]
    heldout = pool[cfg.prompts : cfg.prompts + cfg.heldout_prompts]

    def gen_progress(label):
        return (lambda i, n, path: i and say(f"{label}: batch {i}/{n} ready")) if bar is None else bar(label)

    train_paths = build_dataset(target, train_prompts, out / "data", cfg.gen_batch, cfg.max_new_tokens,
                                seed=cfg.train.seed, progress=gen_progress("teacher answers"))
    held_paths = build_dataset(target, heldout, out / "heldout", cfg.gen_batch, cfg.max_new_tokens,
                               seed=cfg.train.seed + 10_000, progress=gen_progress("held-out answers"))
    train_rows, eval_rows = load_rows(train_paths), load_rows(held_paths)
    n_tokens = sum(len(r["ids"]) for r in train_rows)
    say(f"teacher data: {len(train_rows)} answers, {n_tokens} tokens; held out: {len(eval_rows)} answers")
    eval_probs = target_eval_probs(target, eval_rows, cfg.train.max_length)

    config = draft_config(target.model.config, cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads)
    draft = build_draft(target.model, config, seed=cfg.train.seed)
    n_params = sum(p.numel() for p in draft.parameters())
    say(f"draft: {cfg.layers} layers x {cfg.hidden} wide, {n_params / 1e6:.1f} M parameters (tied head)")
    step_bar = None if bar is None else bar("training")
    last = train(draft, target.tokenizer, train_rows, eval_rows, eval_probs, out, cfg.train, resume=resume,
                 say=say, progress=step_bar)
    export(draft, target.tokenizer, out / "draft")
    say(f"draft saved to {out / 'draft'}")
    return last
