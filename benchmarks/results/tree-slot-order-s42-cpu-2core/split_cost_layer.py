"""`_attend_block` per layer call, random data of the default target's attention shapes: without splits (float32
KEY_BLOCKs throughout, the engine before) and with (`static.splits`, as a target's eager bf16 forward calls it), 3
alternating rounds of 300 calls; a step (n = 1) and 29 rows, after 100 and 868 cached slots."""

import time

import torch

from multispec.models import static

heads, group, dim = 3, 3, 64


def bench(f, reps=300):
    for _ in range(30):
        f()
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t0) / reps * 1e6


for past, n in ((100, 1), (868, 1), (100, 29), (868, 29)):
    keys = torch.randn(1, heads, 1024, dim)
    values = static.with_ones(torch.randn(1, heads, 1024, dim))
    query = torch.randn(1, heads * group, n, dim).to(torch.bfloat16)
    width = past + n
    seen = torch.ones(1, n, width, dtype=torch.bool).tril(past)
    mask = torch.zeros(seen.shape).masked_fill_(~seen, torch.finfo(torch.float32).min)[:, None]
    k, v = keys[:, :, :width], values[:, :, : static.whole_blocks(width)]
    split = static.splits(torch.arange(past, past + n)[None])
    rounds = []
    for _ in range(3):
        before = bench(lambda k=k, v=v, q=query, m=mask: static._attend_block(q, k, v, m, 0.125, 0.0))
        now = bench(lambda k=k, v=v, q=query, m=mask, s=split: static._attend_block(q, k, v, m, 0.125, 0.0, split=s))
        rounds.append((round(before), round(now)))
    print(f"{past} cached, {n} new: (before, with splits) us per call, 3 rounds: {rounds}")
