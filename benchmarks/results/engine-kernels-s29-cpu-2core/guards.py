"""Session 29: a one-token compiled step (HFModel.forward, 300 cached tokens, medians of 60) with dynamo's guard
checks and with them skipped, draft then target, twice each. Run as `python guards.py`."""
import statistics
import time

import torch

from multispec.api import load_pair


def median_ms(f, n=60):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


pair = load_pair(compile=True)
for m in (pair.draft, pair.target):
    c = m.new_cache()
    m.forward(c, torch.randint(100, 2000, (1, 300)))

    def step(m=m, c=c):
        m.forward(c, torch.tensor([[42]]))
        m.crop(c, 300)

    for _ in range(5):
        step()
    for _ in range(2):
        a = median_ms(step)
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            b = median_ms(step)
        print(m.name, f"forward {a:.2f} ms, guards skipped {b:.2f} ms", flush=True)
