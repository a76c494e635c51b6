"""Where a compiled one-token target step's time goes: the whole `HFModel.forward` call, the compiled call
alone (dynamo's guards and the graph), and the graph's operators (torch profiler), beside the memory bound.

    python benchmarks/step_overhead.py [--context 300] [--steps 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_curve import read_bandwidth, weight_bytes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--tokens", type=int, default=1, help="new tokens per step")
    args = ap.parse_args()
    from multispec.api import load_model

    model = load_model(None, None, compile=True)
    gen = torch.Generator().manual_seed(0)
    cache = model.new_cache()
    model.forward(cache, torch.randint(model.vocab_size, (1, args.context), generator=gen))
    tokens = torch.randint(model.vocab_size, (1, args.tokens), generator=gen)
    for _ in range(3):  # the compile, then warm calls
        model.forward(cache, tokens)
        model.crop(cache, args.context)

    inner = {"seconds": []}
    run = model.steps.run

    def timed(*a, **k):
        t0 = time.perf_counter()
        out = run(*a, **k)
        inner["seconds"].append(time.perf_counter() - t0)
        return out

    model.steps.run = timed
    whole = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        model.forward(cache, tokens)
        whole.append(time.perf_counter() - t0)
        model.crop(cache, args.context)
    model.steps.run = run

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            model.forward(cache, tokens)
            model.crop(cache, args.context)
    events = prof.key_averages()
    bandwidth = read_bandwidth()
    bound = weight_bytes(model) / bandwidth
    ms = 1000
    print(
        f"read bandwidth {bandwidth / 1e9:.1f} GB/s; bound of one step {bound * ms:.2f} ms "
        f"({weight_bytes(model) / 1e6:.0f} MB)"
    )
    print(
        f"T({args.tokens}) at c = {args.context}: forward {statistics.median(whole) * ms:.2f} ms, compiled call "
        f"{statistics.median(inner['seconds']) * ms:.2f} ms (median of {args.steps}); "
        f"forward / bound {statistics.median(whole) / bound:.2f}"
    )
    print(events.table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
