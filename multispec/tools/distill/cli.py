"""`multispec distill`: train a draft for a target, or (`--eval`) measure any pair."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _positive(args, *names) -> None:
    for name in names:
        value = getattr(args, name.replace("-", "_"))
        if value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")


def run(args) -> int:
    from tqdm import tqdm

    from ...api import load_model, load_pair
    from . import DistillConfig, TrainConfig, count_tokens, distill
    from .evaluate import evaluate_pair, format_report
    from .prompts import default_data_dir, mt_bench_prompts

    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    if args.eval:
        _positive(args, "eval-prompts", "eval-tokens")
        rows = mt_bench_prompts(data_dir, spread=args.spread, with_categories=True)[: args.eval_prompts]
        prompts, categories = [text for text, _ in rows], [c for _, c in rows]
        pair = load_pair(args.target, args.draft)
        if pair.draft is None:
            raise ValueError("--eval needs a draft: pass --draft")
        bar = tqdm(total=len(prompts), desc="eval", unit="prompt", file=sys.stderr, disable=args.json)
        report = evaluate_pair(
            pair.target,
            pair.draft,
            prompts,
            max_new_tokens=args.eval_tokens,
            progress=lambda i, n: bar.update(1),
            categories=categories if args.spread else None,
        )
        bar.close()
        if args.json:
            print(json.dumps({"models": pair.description, **report}))
        else:
            print(format_report(report, pair.target.name, pair.draft.name))
        return 0

    if args.out is None:
        raise ValueError("distill needs --out DIR (where data, checkpoints and the draft go)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    _positive(
        args,
        "max-new-tokens",
        "gen-batch",
        "steps",
        "batch-tokens",
        "hidden",
        "eval-every",
        "checkpoint-every",
        "draft-vocab",
    )
    for name in ("self-prompts", "on-policy"):
        if getattr(args, name.replace("-", "_")) < 0:
            raise ValueError(f"--{name} must be >= 0, got {getattr(args, name.replace('-', '_'))}")
    if args.prompts < (0 if args.extra_data or args.self_prompts else 1):
        raise ValueError(f"--prompts must be >= 1 (or 0 with --extra-data or --self-prompts), got {args.prompts}")
    for name in ("heads", "kv-heads", "layers", "intermediate"):
        if getattr(args, name.replace("-", "_")) is not None:
            _positive(args, name)
    if args.minutes is not None and args.minutes <= 0:
        raise ValueError(f"--minutes must be > 0, got {args.minutes}")
    if args.lr <= 0:
        raise ValueError(f"--lr must be > 0, got {args.lr}")
    cfg = DistillConfig(
        prompts=args.prompts,
        self_prompts=args.self_prompts,
        on_policy=args.on_policy,
        gen_batch=args.gen_batch,
        max_new_tokens=args.max_new_tokens,
        hidden=args.hidden,
        layers=args.layers,
        intermediate=args.intermediate,
        heads=args.heads,
        kv_heads=args.kv_heads,
        init=args.init,
        extra_data=[Path(x) for x in args.extra_data],
        init_from=Path(args.init_from) if args.init_from else None,
        teacher_dtype=args.teacher_dtype,
        kind=args.kind,
        draft_vocab=args.draft_vocab,
        train=TrainConfig(
            steps=args.steps,
            minutes=args.minutes,
            batch_tokens=args.batch_tokens,
            lr=args.lr,
            seed=args.seed,
            eval_every=args.eval_every,
            checkpoint_every=args.checkpoint_every,
            dtype=args.train_dtype,
        ),
    )
    target = load_model(args.target)
    if target.tokenizer is None:
        raise ValueError(f"target {target.name!r} has no tokenizer; distillation needs text prompts")
    bars = {}

    def bar(label):
        def update(i, n, *rest):
            b = bars.get(label)
            if b is None:  # the first call: before any work (data) or after the first step (training)
                b = bars[label] = tqdm(total=n, initial=i, desc=label, file=sys.stderr, dynamic_ncols=True)
            b.update(i - b.n)
            if rest and isinstance(rest[0], float):
                b.set_postfix(loss=f"{rest[0]:.3f}", refresh=False)
            if i >= n:
                b.close()

        return update

    if args.count_tokens:
        path = count_tokens(target, out, cfg, data_dir=data_dir, say=lambda m: tqdm.write(m, file=sys.stderr), bar=bar)
        print(json.dumps({"token_counts": str(path)}))
        return 0
    last = distill(
        target, out, cfg, data_dir=data_dir, resume=args.resume, say=lambda m: tqdm.write(m, file=sys.stderr), bar=bar
    )
    print(json.dumps({"draft": str(out / ("eagle" if args.kind == "eagle" else "draft")), **last}))
    return 0
