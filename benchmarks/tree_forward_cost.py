"""The cost of a bigger tree: the target's forward time for the pending committed token plus k = 0..32
tree-masked nodes, in float32 and bfloat16, on the default target, as a ratio to its own plain one-token
step (k = 0).

Each dtype's model scores k tokens of a random token tree (branching 4 at the root, then 2, as trees
of `mcsd` look) on a ~200-token cache, which is then cropped back; sizes run in interleaved rounds so
machine noise hits them alike; the figure is the median over rounds. Usage:
    python benchmarks/tree_forward_cost.py [--rounds 7] [--out FILE.json]
"""

import argparse
import json
import time

import numpy as np
import torch

import multispec
from multispec.engine import Entries, ModelRunner
from multispec.trees import TokenTree

SIZES = list(range(0, 17)) + [20, 24, 28, 32]  # tree nodes, scored with the one pending committed token


def tree_of(k: int) -> TokenTree:
    parents = [-1 if g < 4 else (g - 4) // 2 for g in range(k)]
    return TokenTree.from_parents(parents)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    prompt = multispec.load_pair(draft=None).target.encode("Write a short story about a lighthouse keeper. " * 12)
    results = {}
    for dtype in ("float32", "bfloat16"):
        model = multispec.api.load_model(None, dtype=dtype)
        runner = ModelRunner(model)
        runner.feed([prompt])  # the cache holds the prompt but its last token
        base = runner.committed
        times = {k: [] for k in SIZES}
        for _ in range(args.rounds):
            for k in SIZES:
                tree = tree_of(k)
                start = time.perf_counter()
                runner.feed([prompt + [5]], Entries.tree(tree, torch.full((k,), 7)) if k else None)
                times[k].append(time.perf_counter() - start)
                runner.commit(base + 1)
                model.crop(runner.cache, base)
                runner.committed = base
        med = {k: float(np.median(v)) for k, v in times.items()}
        results[dtype] = {
            "ms": {k: 1000 * med[k] for k in SIZES},
            "ratio_to_plain": {k: med[k] / med[0] for k in SIZES},
        }
        print(
            f"{dtype}: plain step {1000 * med[0]:.1f} ms; 1 + k tokens / plain step: "
            + ", ".join(f"{k}: {med[k] / med[0]:.2f}" for k in SIZES)
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
