"""A feature-level draft head against the shipped draft, on the default target, in one run.

Per held-out prompt (MT-Bench and Spec-Bench dev, spread over their categories), each method runs with the shipped
draft and with the head, one after the other, and `ar` once: paired speeds, tokens per target call, first-position
acceptance, and the draft's seconds per drafted token against the target's seconds per call.

    python benchmarks/eagle_head.py --head runs/head/eagle --out benchmarks/results/eagle-head/run.json

`--pool-after N` runs held-out prompts of the training pool instead (those after the first N, which a run of
`distill --prompts N` trained on): where both drafts agree with the target more there than on the evaluation
sets, the gap between them is the head's, not the prompts'.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from multispec import generate, load_pair
from multispec.machine import describe_device
from multispec.models.eagle import load_eagle
from multispec.tools.bench.prompts import load_prompts
from multispec.tools.distill.prompts import default_data_dir, prompt_pool

METHODS = ("sd:gamma=1", "sd:gamma=4", "sd:gamma=auto,drafter=hybrid", "mcsd:tree=auto")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--head", required=True, help="the head's folder")
    ap.add_argument("--out", required=True, help="a JSON file; its rows are also written, one by one, beside it")
    ap.add_argument("--prompts", type=int, default=10, help="prompts from each set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, action="append", default=None)
    ap.add_argument("--method", action="append", default=None)
    ap.add_argument(
        "--pool-after",
        type=int,
        default=None,
        help="held-out training-pool prompts (those after the first N) instead of MT-Bench and Spec-Bench dev",
    )
    args = ap.parse_args()
    pair = load_pair()
    head = load_eagle(args.head, pair.target)
    drafts = {"draft": pair.draft, "head": head}
    methods = args.method or list(METHODS)
    if args.pool_after is not None:
        pool = prompt_pool(default_data_dir())  # distill's order (its default seed)
        prompts = pool[args.pool_after : args.pool_after + 2 * args.prompts]
    else:
        prompts = [
            p.text
            for name in ("mt-bench", "spec-bench-dev")
            for p in load_prompts([name], limit=args.prompts, spread=True)
        ]
    rows = []
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    progress = out_path.with_suffix(".rows.jsonl").open("w")  # every finished row, at once: a stop loses none
    for temperature in args.temperature or [0.0, 1.0]:
        for i, prompt in enumerate(prompts):
            common = dict(temperature=temperature, max_new_tokens=args.max_new_tokens, seed=i)
            ar = generate(pair.target, None, prompt, method="ar", **common)
            rows.append({"T": temperature, "prompt": i, "method": "ar", "drafts": None, **_measures(ar)})
            progress.write(json.dumps(rows[-1]) + "\n")
            for method in methods:
                for name, draft in drafts.items():
                    r = generate(pair.target, draft, prompt, method=method, **common)
                    row = {"T": temperature, "prompt": i, "method": method, "drafts": name, **_measures(r)}
                    row["speed_over_ar"] = row["tokens_per_second"] / _ar(rows, temperature, i)
                    if temperature == 0:
                        row["equals_ar"] = r.token_ids == ar.token_ids
                    rows.append(row)
                    progress.write(json.dumps(row) + "\n")
                    progress.flush()
            print(f"T={temperature} prompt {i + 1}/{len(prompts)}", flush=True)
    summary = _summary(rows, methods)
    out = {
        "machine": describe_device(pair.target.device),
        "head": args.head,
        "prompts": len(prompts),
        "prompt_set": f"training pool after {args.pool_after}" if args.pool_after is not None else "evaluation",
        "max_new_tokens": args.max_new_tokens,
        "summary": summary,
        "rows": rows,
    }
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


def _ar(rows, temperature, prompt) -> float:
    return next(
        r["tokens_per_second"] for r in rows if r["T"] == temperature and r["prompt"] == prompt and r["method"] == "ar"
    )


def _measures(r) -> dict:
    s = r.stats
    return {
        "tokens": s.new_tokens,
        "tokens_per_second": s.tokens_per_second,
        "tokens_per_call": s.new_tokens / max(1, s.target_calls),
        "first_acceptance": (s.position_acceptance or [None])[0],
        "draft_seconds_per_token": s.draft_seconds / s.drafted if s.drafted else None,
        "target_seconds_per_call": s.target_seconds / max(1, s.target_calls),
    }


def _summary(rows, methods) -> dict:
    out = {}
    for temperature in sorted({r["T"] for r in rows}):
        for method in methods:
            for name in ("draft", "head"):
                mine = [r for r in rows if r["T"] == temperature and r["method"] == method and r["drafts"] == name]
                if not mine:
                    continue

                def median(key, mine=mine):
                    values = [r[key] for r in mine if r[key] is not None]
                    return statistics.median(values) if values else None

                cost = [
                    r["draft_seconds_per_token"] / r["target_seconds_per_call"]
                    for r in mine
                    if r["draft_seconds_per_token"]
                ]
                out[f"T={temperature:g} {method} [{name}]"] = {
                    "speed_over_ar": median("speed_over_ar"),
                    "tokens_per_call": median("tokens_per_call"),
                    "first_acceptance": median("first_acceptance"),
                    "draft_step_over_target_call": statistics.median(cost) if cost else None,
                    "equals_ar": sum(r.get("equals_ar", False) for r in mine) if temperature == 0 else None,
                }
    return out


if __name__ == "__main__":
    main()
