"""Draft training by distillation (`multispec distill`).

    data     the target answers a prompt pool (teacher.py, prompts.py), keeping its distributions
    model    a narrow Llama sliced from the target's first layers, or from its embeddings only (model.py)
    train    KL to the target's distributions, checkpoints, resume, held-out evaluation (train.py)
    eval     acceptance measures of any pair on held-out MT-Bench prompts (evaluate.py)

Output folder layout: data/, heldout/ and heldout-self/ (teacher shards), on-policy/ (the draft's answers, scored by
the target), checkpoint.pt, log.jsonl (training curve),
draft/ (an ordinary transformers checkpoint of the draft, with the target's tokenizer, and token_counts.safetensors:
how often the target wrote each token in its training answers, which ranks the tokens a reduced draft vocabulary
keeps, `draft_vocab=N`). `count_tokens` writes those counts alone, for a draft trained elsewhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...models.vocab import save_token_counts
from .data import _progress, _teacher, answer_counts, teacher_data
from .model import build_draft, draft_config, reshape_draft
from .prompts import default_data_dir, mt_bench_prompts, prompt_pool
from .teacher import build_dataset, build_on_policy, load_rows
from .train import TrainConfig, export, train

__all__ = [
    "DistillConfig",
    "TrainConfig",
    "answer_counts",
    "build_draft",
    "count_tokens",
    "distill",
    "draft_config",
    "mt_bench_prompts",
    "prompt_pool",
]


@dataclass
class DistillConfig:
    prompts: int = 768  # training prompts taken from the pool
    self_prompts: int = 0  # training prompts the target writes itself (teacher.self_written_prompts)
    heldout_prompts: int = 32  # pool prompts answered for the evaluation printed during training
    gen_batch: int = 32
    max_new_tokens: int = 160
    hidden: int = 198
    layers: int | None = None  # None: 4 for a new draft, unchanged for init_from
    intermediate: int | None = None  # MLP width; None: the target's for a new draft, unchanged for init_from
    heads: int | None = None  # None: the target's (the sliced initialisation needs the target's)
    kv_heads: int | None = None
    init: str = "sliced"  # or "embeddings"
    teacher_dtype: str = "bfloat16"  # the target's copy that writes and answers the prompts; "float32": the target
    # itself. bfloat16 generates faster where the CPU has bfloat16 instructions; its next-token distributions stay
    # close to the float32 target's (measured: NOTES.md and the draft-d8 results folder)
    on_policy: int = 0  # training prompts the draft answers itself before training (its answers scored by the target)
    extra_data: list[Path] = field(default_factory=list)  # teacher shards of earlier runs, added to training
    kind: str = "draft"  # or "eagle": a feature-level head reading the target's hidden states (`eagle.py`)
    draft_vocab: int = 16384  # a head's draft vocabulary: the tokens the target's training answers hold most
    unroll: int = 2  # a head's training passes: 2 also trains its second draft on its own features
    init_from: Path | None = None  # start from this saved draft instead of a new one (hidden/init unused; more
    # layers or a narrower MLP reshape it, see model.reshape_draft)
    train: TrainConfig = field(default_factory=TrainConfig)


def distill(
    target, out: Path, cfg: DistillConfig, data_dir: Path | None = None, resume: bool = False, say=print, bar=None
) -> dict:
    """Generate (or reuse) the teacher data, build the draft, train it; returns the last evaluation."""
    out.mkdir(parents=True, exist_ok=True)
    if (out / "checkpoint.pt").exists() and not resume:
        raise ValueError(f"{out} already holds a training run; pass --resume to continue it or choose another --out")
    data_dir = data_dir or default_data_dir()
    if cfg.kind == "eagle":
        from .eagle import distill_eagle

        return distill_eagle(target, out, cfg, data_dir, resume, say, bar)
    if cfg.init_from is not None:  # checked before the (long) generation
        start = _load_draft(Path(cfg.init_from), target)
        if (cfg.layers or 10**9) < start.config.num_hidden_layers or (
            cfg.intermediate or 0
        ) > start.config.intermediate_size:
            raise ValueError(
                f"--init-from {cfg.init_from} has {start.config.num_hidden_layers} layers with MLP "
                f"{start.config.intermediate_size}; reshaping only adds layers and narrows the MLP"
            )
    data = teacher_data(target, out, cfg, data_dir, say, bar)
    train_rows, eval_rows, eval_probs = data.train_rows, data.eval_rows, data.eval_probs
    more_evals, teacher = data.more_evals, data.teacher

    # the sliced init's residual basis and the reshape's MLP pruning are measured on the first training answers
    samples = [torch.cat([r["prompt_ids"], r["ids"]])[: cfg.train.max_length] for r in train_rows[:32]]
    if cfg.init_from is not None:
        draft, how = start, f"from {cfg.init_from}"
        layers = cfg.layers or start.config.num_hidden_layers
        intermediate = cfg.intermediate or start.config.intermediate_size
        if (layers, intermediate) != (start.config.num_hidden_layers, start.config.intermediate_size):
            draft = reshape_draft(start, layers, intermediate, samples, seed=cfg.train.seed)
            how += f", reshaped from {start.config.num_hidden_layers} layers with MLP {start.config.intermediate_size}"
    else:
        # a sliced draft inherits the target's whole MLP; a narrower one keeps the units that contribute most
        prune = cfg.init == "sliced" and cfg.intermediate and cfg.intermediate < target.model.config.intermediate_size
        config = draft_config(
            target.model.config,
            cfg.hidden,
            cfg.layers or 4,
            cfg.heads,
            cfg.kv_heads,
            intermediate=None if prune else cfg.intermediate,
        )
        draft = build_draft(target.model, config, seed=cfg.train.seed, init=cfg.init, samples=samples)
        if prune:
            draft = reshape_draft(draft, config.num_hidden_layers, cfg.intermediate, samples, seed=cfg.train.seed)
        how = f"{cfg.init} init"
    n_params = sum(p.numel() for p in draft.parameters())
    say(
        f"draft: {draft.config.num_hidden_layers} layers x {draft.config.hidden_size} wide, MLP "
        f"{draft.config.intermediate_size} ({how}), "
        f"{n_params / 1e6:.1f} M parameters"
    )
    if cfg.on_policy:
        on_policy = _on_policy_rows(draft, teacher, train_rows, out / "on-policy", cfg, say, _progress(say, bar))
        train_rows = train_rows + on_policy
    del teacher  # the held-out measures are against the target itself
    step_bar = None if bar is None else bar("training")
    last = train(
        draft,
        target.tokenizer,
        train_rows,
        eval_rows,
        eval_probs,
        out,
        cfg.train,
        resume=resume,
        say=say,
        progress=step_bar,
        more_evals=more_evals,
    )
    export(draft, target.tokenizer, out / "draft")
    save_token_counts(out / "draft", answer_counts(train_rows, target.vocab_size), "the target's training answers")
    say(f"draft saved to {out / 'draft'}")
    return last


def count_tokens(target, out: Path, cfg: DistillConfig, data_dir: Path | None = None, say=print, bar=None) -> Path:
    """The token counts a reduced draft vocabulary ranks by, for a draft trained elsewhere: the target answers the
    first `cfg.prompts` pool prompts (the teacher data a `distill` run into `out` would write, and reuses), and
    the answers' tokens are counted into `out/token_counts.safetensors`. Resumable: finished batches are kept."""
    pool = prompt_pool(data_dir or default_data_dir(), seed=cfg.train.seed)[: cfg.prompts]
    paths = build_dataset(
        _teacher(target, cfg.teacher_dtype),
        pool,
        out / "data",
        cfg.gen_batch,
        cfg.max_new_tokens,
        seed=cfg.train.seed,
        progress=None if bar is None else bar("teacher answers"),
    )
    rows = load_rows(paths)
    counts = answer_counts(rows, target.vocab_size)
    say(f"{int(counts.sum())} answer tokens of {len(rows)} answers; {int((counts > 0).sum())} distinct token ids")
    return save_token_counts(out, counts, f"the target's answers to {len(pool)} draft-training prompts")


def _on_policy_rows(
    draft, teacher, train_rows: list[dict], folder: Path, cfg: DistillConfig, say, progress
) -> list[dict]:
    """The starting draft answers `cfg.on_policy` of the training prompts (a seeded choice, each prompt once)."""
    prompts = list({tuple(r["prompt_ids"].tolist()): None for r in train_rows})
    random.Random(cfg.train.seed + 40_000).shuffle(prompts)
    chosen = [list(p) for p in prompts[: cfg.on_policy]]
    paths = build_on_policy(
        draft,
        teacher,
        chosen,
        folder,
        cfg.gen_batch,
        cfg.max_new_tokens,
        seed=cfg.train.seed + 50_000,
        progress=progress("draft answers"),
    )
    rows = load_rows(paths)
    say(
        f"on-policy data: the draft answered {len(chosen)} training prompts"
        + (f" (all there are; {cfg.on_policy} asked)" if len(chosen) < cfg.on_policy else "")
        + f", {len(rows)} answers of 2+ tokens, {sum(len(r['ids']) for r in rows)} tokens, scored by the target"
    )
    return rows


def _load_draft(folder: Path, target):
    """A saved draft to continue training (float32), checked against the target's vocabulary."""
    from transformers import AutoModelForCausalLM

    if not (folder / "config.json").exists():
        raise ValueError(f"--init-from {folder}: no config.json there (expected a saved draft folder)")
    draft = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    rows = draft.get_input_embeddings().weight.shape[0]
    if rows < target.vocab_size:
        raise ValueError(f"--init-from {folder}: its vocabulary has {rows} tokens, the target's {target.vocab_size}")
    return draft
