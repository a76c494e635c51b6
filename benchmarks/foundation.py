"""Speed of `ar` and `sd` against Hugging Face's own generate, with and without `assistant_model`,
on the same pair, prompts and settings, in one run (greedy, 128 new tokens by default).

Methods are interleaved prompt by prompt so that machine noise hits them alike; the report gives
tokens/s (prefill included, for every method alike), ratios to `ar`, and the share of multispec's
decode time spent outside model forward calls.

    python benchmarks/foundation.py --prompts 8 --gammas 2,3,4,5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import multispec

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mt_bench.jsonl"


def load_prompts(n: int) -> list[str]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows[:n]]


def hf_generate(target, draft, ids: list[int], max_new_tokens: int) -> tuple[int, float, list[int]]:
    inputs = torch.tensor([ids])
    kwargs = {"assistant_model": draft.model} if draft is not None else {}
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = target.model.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=target.eos_token_id,
            **kwargs,
        )
    seconds = time.perf_counter() - t0
    new = out[0, len(ids) :].tolist()
    return len(new), seconds, new


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gammas", default="2,3,4,5")
    ap.add_argument("--json", default=None, help="write the raw rows here")
    args = ap.parse_args()

    pair = multispec.load_pair()
    t, d = pair.target, pair.draft
    prompts = load_prompts(args.prompts)
    gammas = [int(g) for g in args.gammas.split(",")]
    methods = ["ar"] + [f"sd:{g}" for g in gammas] + ["hf", "hf-assisted"]
    # warm-up
    multispec.generate(t, d, prompts[0], method="sd", temperature=0, max_new_tokens=8)
    hf_generate(t, d, t.encode(prompts[0]), 8)

    rows = []
    for i, prompt in enumerate(prompts):
        ids = t.encode(prompt)
        reference = None
        for m in methods:
            if m in ("hf", "hf-assisted"):
                n, sec, toks = hf_generate(t, d if m == "hf-assisted" else None, ids, args.max_new_tokens)
                fwd = None
            else:
                kw = {"gamma": int(m.split(":")[1])} if m.startswith("sd") else {}
                r = multispec.generate(
                    t, d, ids, method=m.split(":")[0], temperature=0, max_new_tokens=args.max_new_tokens, **kw
                )
                n, sec, toks, fwd = r.stats["new_tokens"], r.stats["seconds"], r.token_ids, r.stats["forward_seconds"]
                calls = r.stats["target_calls"]
            if reference is None:
                reference = toks
            rows.append(
                {
                    "prompt": i,
                    "method": m,
                    "tokens": n,
                    "seconds": sec,
                    "forward_seconds": fwd,
                    "same_as_ar": toks[: len(reference)] == reference[: len(toks)],
                    "target_calls": calls if fwd is not None else None,
                }
            )
            print(f"prompt {i} {m:12s} {n:4d} tokens {n / sec:6.1f} tok/s", file=sys.stderr)

    print(f"\nembedded pair: {' / '.join(pair.description.values())}")
    print(
        f"{len(prompts)} MT-Bench prompts, greedy, max {args.max_new_tokens} new tokens, torch threads "
        f"{torch.get_num_threads()}; tokens/s include prefill\n"
    )
    print("| method | tokens/s (total) | median per-prompt ratio to ar | block efficiency | time outside forwards |")
    print("|---|---|---|---|---|")
    by = {m: [r for r in rows if r["method"] == m] for m in methods}
    ar_rate = {r["prompt"]: r["tokens"] / r["seconds"] for r in by["ar"]}
    for m in methods:
        rs = by[m]
        total = sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs)
        ratio = statistics.median((r["tokens"] / r["seconds"]) / ar_rate[r["prompt"]] for r in rs)
        if rs[0]["forward_seconds"] is not None:
            outside = 1 - sum(r["forward_seconds"] for r in rs) / sum(r["seconds"] for r in rs)
            be = sum(r["tokens"] for r in rs) / sum(r["target_calls"] for r in rs)
            extra = f"{be:.2f} | {outside:.1%}"
        else:
            extra = "– | –"
        print(f"| {m} | {total:.1f} | {ratio:.2f} | {extra} |")
    same = all(r["same_as_ar"] for r in rows)
    print(f"\nall methods produced the same greedy tokens as ar: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
