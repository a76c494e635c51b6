"""Where a batch's wall time goes: inside the batched forwards, or between them (the rows' own work: drafting
logic, verification, commit, and the scheduler's). For each row count R and method, `generate_batch` over R
prompts at once (one wave: every row starts together, so no row waits for a free one), then the batcher's
counters: forwards, the seconds inside them, rows per forward, and the rest of the wall time.

    python benchmarks/batch_split.py [--rows 1,8,32,64] [--tokens 64] [--device cuda] [--out FILE.jsonl]

The default pair as loaded with no flags (eager batched steps). A method whose share inside forwards falls as R
grows spends its time in Python per row: that work, not the model, then bounds the batch.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,8,32,64", help="row counts, comma-separated")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--methods", default="ar,default", help="comma-separated; `default`: the default method")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="a JSONL file of the rows")
    args = ap.parse_args()

    from multispec import batching, load_pair
    from multispec.api import DEFAULT_METHOD
    from multispec.tools.bench.prompts import load_prompts

    pair = load_pair(device=args.device)
    texts = [p.text for p in load_prompts(["mt-bench", "spec-bench-dev"], spread=True)]
    seen = {}
    close = batching.Batcher.close

    def keep(self):  # the batcher of the last `generate_batch`, for its counters
        seen["batcher"] = self
        return close(self)

    batching.Batcher.close = keep
    batching.generate_batch(pair.target, pair.draft, texts[:2], max_new_tokens=4, temperature=0)  # warm-up
    rows_out = []
    for rows in [int(r) for r in args.rows.split(",")]:
        prompts = [texts[i % len(texts)] for i in range(rows)]
        for name in args.methods.split(","):
            method = DEFAULT_METHOD if name == "default" else name
            t0 = time.perf_counter()
            results = batching.generate_batch(
                pair.target, pair.draft, prompts, method=method, rows=rows, max_new_tokens=args.tokens, temperature=0
            )
            wall = time.perf_counter() - t0
            stats = seen["batcher"].stats
            tokens = sum(r.stats["new_tokens"] for r in results)
            row = {
                "rows": rows,
                "method": name,
                "device": str(pair.target.device),
                "tokens": tokens,
                "wall_seconds": wall,
                "tokens_per_second": tokens / wall,
                "forwards": stats["forwards"],
                "rows_per_forward": stats["rows"] / max(stats["forwards"], 1),
                "forward_seconds": stats["seconds"],
                "share_in_forwards": stats["seconds"] / wall,
                "ms_per_forward": 1e3 * stats["seconds"] / max(stats["forwards"], 1),
                "ms_between_forwards": 1e3 * (wall - stats["seconds"]) / max(stats["forwards"], 1),
                "tokens_per_target_call": sum(r.stats["new_tokens"] for r in results)
                / max(sum(r.stats.get("target_calls", 0) for r in results), 1),
            }
            rows_out.append(row)
            print(
                f"{rows:3d} rows, {name:8s}: {row['tokens_per_second']:7.1f} tokens/s; {row['forwards']} forwards of "
                f"{row['rows_per_forward']:.1f} rows, {row['ms_per_forward']:.1f} ms each, "
                f"{row['ms_between_forwards']:.1f} ms between; {100 * row['share_in_forwards']:.0f} % of the wall "
                f"time in forwards; {row['tokens_per_target_call']:.2f} tokens a target call",
                flush=True,
            )
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
