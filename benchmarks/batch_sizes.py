"""The seeds' question at batch > 1: how many tokens each target call makes, and how fast, for speculative
methods decoded in batches of 1, 2, 4, ... rows (`multispec.generate_batch`, in one process, on the default
pair), beside `ar` in the same batches. The papers measured batch 1 only; this shows where each method stops
paying as the batch grows.

    python benchmarks/batch_sizes.py --out benchmarks/results/batch-sizes --rows 1,2,4,8 --prompts 8 \
        --max-new-tokens 48 --method ar --method sd:gamma=3 --method mcsd:k_config=2x2 \
        --method specinfer:k_config=2x1x1 --method default

For each method and row count, the same prompts (MT-Bench and Spec-Bench dev first turns, in turn) are decoded
greedily, `rows` at a time. Written: results.json (every figure), table.md and batch_sizes.png.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--prompts", type=int, default=8, help="prompts decoded per method and row count")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--method", action="append", default=None, help="repeatable; `default`: the default method")
    args = ap.parse_args()
    import torch

    import multispec
    from multispec.params import DEFAULT_METHOD
    from multispec.tools.bench.prompts import load_prompt_file

    sets = [[p.text for p in load_prompt_file(name)] for name in ("mt-bench", "spec-bench-dev")]
    prompts = [texts[i] for i in range(max(map(len, sets))) for texts in sets if i < len(texts)][: args.prompts]
    counts = [int(r) for r in args.rows.split(",")]
    methods = args.method or ["ar", "sd:gamma=3", "default"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pair = multispec.load_pair()
    for method in methods:  # warm-up: lazy initialisation, the batched step's cost curve
        name = DEFAULT_METHOD if method == "default" else method
        multispec.generate_batch(pair.target, pair.draft, prompts[:2], name, max_new_tokens=4, temperature=0)
    rows = []
    for count in counts:
        for method in methods:
            name = DEFAULT_METHOD if method == "default" else method
            t0 = time.perf_counter()
            results = multispec.generate_batch(
                pair.target, pair.draft, prompts, name, rows=count, max_new_tokens=args.max_new_tokens, temperature=0
            )
            seconds = time.perf_counter() - t0
            tokens = sum(len(r.token_ids) for r in results)
            calls = sum(r.stats["target_calls"] for r in results)
            row = {
                "rows": count,
                "method": method,
                "tokens": tokens,
                "seconds": seconds,
                "tokens_per_second": tokens / seconds,
                "tokens_per_target_call": tokens / calls,
            }
            rows.append(row)
            print(
                f"{count:2d} rows, {method}: {row['tokens_per_second']:.1f} tokens/s, "
                f"{row['tokens_per_target_call']:.2f} tokens per target call",
                flush=True,
            )
            meta = {
                "date": time.strftime("%Y-%m-%d"),
                "host": platform.node(),
                "torch": torch.__version__,
                "dtype": str(pair.target.dtype).removeprefix("torch."),
                "prompts": len(prompts),
                "max_new_tokens": args.max_new_tokens,
                "rows": rows,
            }
            (out / "results.json").write_text(json.dumps(meta, indent=1))  # kept as it goes
    write_table(out, rows, counts, methods)
    plot(out, rows, counts, methods)
    return 0


def write_table(out: Path, rows: list[dict], counts: list[int], methods: list[str]) -> None:
    at = {(r["rows"], r["method"]): r for r in rows}
    lines = [
        "| method | " + " | ".join(f"{c} rows" for c in counts) + " |",
        "|---|" + "---|" * len(counts),
    ]
    for method in methods:
        cells = []
        for c in counts:
            r, ar = at[(c, method)], at.get((c, "ar"))
            ratio = f", {r['tokens_per_second'] / ar['tokens_per_second']:.2f}x ar" if ar and method != "ar" else ""
            cells.append(f"{r['tokens_per_second']:.1f} tok/s, {r['tokens_per_target_call']:.2f}/call{ratio}")
        lines.append(f"| `{method}` | " + " | ".join(cells) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")


def plot(out: Path, rows: list[dict], counts: list[int], methods: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, calls) = plt.subplots(1, 2, figsize=(10, 4))
    for method in methods:
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["rows"])
        speed.plot([r["rows"] for r in mine], [r["tokens_per_second"] for r in mine], marker="o", label=method)
        calls.plot([r["rows"] for r in mine], [r["tokens_per_target_call"] for r in mine], marker="o", label=method)
    for ax, label in ((speed, "tokens/s, all rows"), (calls, "tokens per target call")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.set_xlabel("rows decoded together")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    speed.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "batch_sizes.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
