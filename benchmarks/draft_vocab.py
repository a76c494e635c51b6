"""Reduced draft vocabularies on the default pair: a draft step's cost and the share of the target's tokens kept.

For each N: the median seconds of a one-token draft step (eager, at a context of 200, as drafting runs it) against
the target's, and the share of the target's greedy answer tokens on held-out prompts (MT-Bench and Spec-Bench dev,
never the counts' prompts) that fall in the N kept ids, the ceiling on how often a draft token can match.

    python benchmarks/draft_vocab.py --out benchmarks/results/draft-vocab/sizes.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from multispec import generate, load_pair
from multispec.machine import describe_device
from multispec.models.vocab import reduce_vocab
from multispec.tools.bench.prompts import load_prompts

SIZES = (0, 32768, 16384, 8192, 4096, 2048, 1024)  # 0: the whole vocabulary


def step_seconds(model, context: int = 200, steps: int = 48, repeats: int = 3) -> float:
    ids = torch.randint(model.vocab_size, (1, context + steps), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(repeats):
        cache = model.new_cache()
        model.forward(cache, ids[:, :context], logits_to_keep=1, batch_invariant=False)
        for i in range(steps):
            t0 = time.perf_counter()
            model.forward(cache, ids[:, context + i : context + i + 1], batch_invariant=False)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=10, help="held-out prompts from each set for the coverage")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--sizes",
        default=",".join(str(n) for n in SIZES),
        help="comma-separated draft vocabularies, 0 for the whole draft (where the draft compiles by default, give "
        "the sizes `multispec compile --only draft --draft-vocab N` made: the others run eagerly)",
    )
    args = ap.parse_args()
    pair = load_pair()
    target, draft = pair.target, pair.draft
    answers = []
    for name in ("mt-bench", "spec-bench-dev"):
        for prompt in load_prompts([name], limit=args.prompts, spread=True):
            r = generate(target, None, prompt.text, method="ar", temperature=0, max_new_tokens=args.max_new_tokens)
            answers += r.token_ids
    seen = torch.bincount(torch.tensor(answers), minlength=target.vocab_size)
    target_step = step_seconds(target)
    rows = []
    for n in (int(size) for size in args.sizes.split(",")):
        model = draft if n == 0 else reduce_vocab(draft, n)
        kept = torch.ones(target.vocab_size, dtype=torch.bool)
        if n:
            kept[:] = False
            kept[model.ids] = True
        seconds = step_seconds(model)
        rows.append(
            {
                "draft_vocab": n or target.vocab_size,
                "draft_step_ms": round(seconds * 1e3, 3),
                "compiled": bool(getattr(getattr(model, "scorer", model), "compile", False)),
                "draft_step_over_target": round(seconds / target_step, 4),
                "target_tokens_kept": round(float(seen[kept].sum() / seen.sum()), 4),
            }
        )
        print(rows[-1], flush=True)
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": describe_device("cpu"),
        "dtype": str(draft.dtype),
        "target_step_ms": round(target_step * 1e3, 3),
        "answer_tokens": int(seen.sum()),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
