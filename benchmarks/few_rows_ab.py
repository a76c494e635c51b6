"""Interleaved A/B of `FewRowsLinear` settings on the default pair: forward time for k new tokens.

old: one row padded to two, transposed product up to 6 rows (session 11);
new: 1, 3 and 7 rows padded to 2, 4 and 8, transposed product up to 11 rows (the current default).
Both settings run in turn on the same cache (~200 tokens), so machine noise hits both alike; the figure
to read is the median of the paired ratios. Usage: python benchmarks/few_rows_ab.py
"""

import time

import numpy as np
import torch

import multispec
from multispec.models import kernels as hf

SETTINGS = {"old": ({1: 2}, 6), "new": ({1: 2, 3: 4, 7: 8}, 11)}


def forward_seconds(model, cache, length: int, k: int) -> float:
    start = time.perf_counter()
    model.forward(cache, torch.full((1, k), 5), logits_to_keep=k)
    seconds = time.perf_counter() - start
    model.crop(cache, length)
    return seconds


def main() -> None:
    torch.set_num_threads(2)
    pair = multispec.load_pair()
    for name, model, reps in (("target", pair.target, 16), ("draft", pair.draft, 40)):
        context = list(range(1000, 1200))
        cache = model.new_cache()
        model.forward(cache, torch.tensor([context]))
        for k in range(1, 13):
            times = {s: [] for s in SETTINGS}
            for _ in range(reps):
                for setting, (pad, few) in SETTINGS.items():
                    hf.PAD_ROWS, hf.FEW_ROWS = pad, few
                    times[setting].append(forward_seconds(model, cache, len(context), k))
            old, new = np.array(times["old"]), np.array(times["new"])
            print(f"{name} k={k:2d}  old {np.median(old) * 1e3:6.1f} ms  new {np.median(new) * 1e3:6.1f} ms  "
                  f"new/old {np.median(new / old):.2f}", flush=True)
    hf.PAD_ROWS, hf.FEW_ROWS = SETTINGS["new"]


if __name__ == "__main__":
    main()
