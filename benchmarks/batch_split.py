"""Where a batch's wall time goes: inside the batched forwards, or between them (the rows' own work: drafting
logic, verification, commit, and the scheduler's). For each row count R and method, `generate_batch` over R
prompts at once (one wave: every row starts together, so no row waits for a free one), then the batcher's
counters: forwards, the seconds inside them, rows per forward, and the rest of the wall time. `--paths` runs `ar`
and fixed `sd` chains both ways, in lockstep (`multispec.lockstep`: the rows' work done together with tensor
operations, as `generate_batch` runs them) and in the threaded batch (`multispec.batching.Batcher`: each row's
work on a pool, as every other method runs), interleaved in one process.

    python benchmarks/batch_split.py [--rows 1,8,32,64] [--tokens 64] [--methods ar,sd:gamma=3,default]
        [--paths lockstep,threaded] [--device cuda] [--out FILE.jsonl]

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
    ap.add_argument("--paths", default="lockstep", help="lockstep and/or threaded, comma-separated")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="a JSONL file of the rows")
    args = ap.parse_args()

    from multispec import batching, load_pair, lockstep
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
    run = lockstep.Lockstep.run

    def keep_lockstep(self, *a, **k):  # the lockstep batch of the last `generate_batch`, for its counters
        seen["batcher"] = self
        return run(self, *a, **k)

    lockstep.Lockstep.run = keep_lockstep
    in_lockstep = batching.runs_in_lockstep
    batching.generate_batch(pair.target, pair.draft, texts[:2], max_new_tokens=4, temperature=0)  # warm-up
    rows_out = []
    outputs_by = {}
    for rows in [int(r) for r in args.rows.split(",")]:
        prompts = [texts[i % len(texts)] for i in range(rows)]
        for name, path in [(m, p) for m in args.methods.split(",") for p in args.paths.split(",")]:
            method = DEFAULT_METHOD if name == "default" else name
            batching.runs_in_lockstep = in_lockstep if path == "lockstep" else lambda *a: None
            seen.clear()
            t0 = time.perf_counter()
            results = batching.generate_batch(
                pair.target, pair.draft, prompts, method=method, rows=rows, max_new_tokens=args.tokens, temperature=0
            )
            wall = time.perf_counter() - t0
            batcher = seen["batcher"]
            ran = "lockstep" if isinstance(batcher, lockstep.Lockstep) else "threaded"
            if ran != path and name != "default":
                raise SystemExit(f"{name} ran {ran}, not {path}")
            stats = batcher.stats
            tokens = sum(r.stats["new_tokens"] for r in results)
            outputs = [r.token_ids for r in results]
            first = outputs_by.setdefault((rows, name), outputs)  # greedy: every path gives each row its tokens
            row = {
                "rows": rows,
                "method": name,
                "path": ran,
                "same_tokens_as_first_path": outputs == first,
                "device": str(pair.target.device),
                "tokens": tokens,
                "wall_seconds": wall,
                "tokens_per_second": tokens / wall,
                "forwards": stats["forwards"],
                "rows_per_forward": stats["rows"] / max(stats["forwards"], 1),
                "forward_seconds": stats["seconds"],
                # lockstep only: between forwards, the rows' work (drawing, verifying, committing, joining)
                **{k: stats[k] for k in ("other_seconds",) if k in stats},
                "share_in_forwards": stats["seconds"] / wall,
                "ms_per_forward": 1e3 * stats["seconds"] / max(stats["forwards"], 1),
                "ms_between_forwards": 1e3 * (wall - stats["seconds"]) / max(stats["forwards"], 1),
                "tokens_per_target_call": sum(r.stats["new_tokens"] for r in results)
                / max(sum(r.stats.get("target_calls", 0) for r in results), 1),
            }
            rows_out.append(row)
            print(
                f"{rows:3d} rows, {name:8s} {ran:8s}: {row['tokens_per_second']:7.1f} tokens/s; "
                f"{row['forwards']} forwards of "
                f"{row['rows_per_forward']:.1f} rows, {row['ms_per_forward']:.1f} ms each, "
                f"{row['ms_between_forwards']:.1f} ms between; {100 * row['share_in_forwards']:.0f} % of the wall "
                f"time in forwards; {row['tokens_per_target_call']:.2f} tokens a target call"
                f"{'' if row['same_tokens_as_first_path'] else '; OTHER TOKENS than the first path'}",
                flush=True,
            )
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
