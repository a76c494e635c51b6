"""What a `dsbd` iteration asks of the target, against a `beam` step: the target's forward time for B cache
rows, each feeding its pending committed token plus S forest entries (a chain per row: the cost depends
on the count, not the shape), on the default target at two context lengths.

`beam` of width W feeds W rows x 1 token per new token; `dsbd` (draft_width 3, gamma 3) feeds its input
beams' rows x (1 + the most entries any row holds): 9 entries in one row when the forest grows from one
beam, 3 per row when spread evenly. Shapes run in interleaved rounds so machine noise hits them alike;
the figure is the median over rounds. Usage:
    python benchmarks/forest_forward_cost.py [--rounds 7] [--out FILE.json]
"""

import argparse
import json
import time

import numpy as np
import torch

import multispec
from multispec.engine import Entries, ModelRunner

SHAPES = [(1, 0), (2, 0), (3, 0), (4, 0), (1, 3), (1, 9), (3, 3), (3, 9)]  # (rows, entries per row)
CONTEXTS = [200, 700]


def forward_seconds(model, context: list[int], rows: int, entries: int) -> float:
    runner = ModelRunner(model)
    runner.feed([context])
    runner.commit(len(context), sources=[0] * rows)
    chain = [(1000 + i, i + 1, tuple(range(i))) for i in range(entries)]
    grown = context + [7]
    start = time.perf_counter()
    runner.feed([grown] * rows, Entries.lists([chain] * rows, 0) if entries else None)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(2)
    target = multispec.load_pair().target
    result = {}
    for c in CONTEXTS:
        context = [(1000 + 37 * i) % 40000 for i in range(c)]
        forward_seconds(target, context, 1, 0)  # warm-up
        times = {shape: [] for shape in SHAPES}
        for _ in range(args.rounds):
            for shape in SHAPES:
                times[shape].append(forward_seconds(target, context, *shape))
        one = np.median(times[(1, 0)])
        result[c] = {f"{rows}x(1+{entries})": float(np.median(t)) for (rows, entries), t in times.items()}
        for (rows, entries), t in times.items():
            print(
                f"context {c:4d}  {rows} rows x (1 + {entries} entries)  {np.median(t) * 1e3:6.1f} ms  "
                f"{np.median(t) / one:4.2f}x one token",
                flush=True,
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"seconds": result, "rounds": args.rounds}, f, indent=1)


if __name__ == "__main__":
    main()
