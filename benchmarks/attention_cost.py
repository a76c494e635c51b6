"""What batch-invariant attention costs: `multispec.models.static._attend_block` (blocks of key slots, the
normaliser in the product, at least 16 query rows per key head) against a plain float32 softmax attention,
interleaved in one process, per layer of the default target's shape (9 query heads, 3 key heads, head dim
64, bfloat16 cache).

    python benchmarks/attention_cost.py > attention-cost.json
"""

import json
import statistics
import time

import torch

from multispec.models.static import _attend_block


def plain(query, keys, values, mask, scaling):
    b, hq, n, d = query.shape
    hk = keys.shape[1]
    group = hq // hk
    q = query.float().reshape(b, hk, group * n, d)
    scores = (torch.matmul(q, keys.float().transpose(-1, -2)) * scaling).view(b, hk, group, n, -1)
    scores = scores + mask.float()[:, :, None]
    probs = torch.softmax(scores, -1).view(b, hk, group * n, -1)
    return torch.matmul(probs, values.float()).view(b, hq, n, -1).to(query.dtype)


def main(repeats: int = 30) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for n, width in ((1, 300), (1, 600), (5, 600), (16, 600), (5, 1200)):
        q = torch.randn(1, 9, n, 64, generator=gen).bfloat16()
        k, v = (torch.randn(1, 3, width, 64, generator=gen).bfloat16() for _ in range(2))
        mask = torch.zeros(1, 1, n, width)
        times = {"plain": [], "invariant": []}
        for _ in range(repeats):
            t0 = time.perf_counter()
            plain(q, k, v, mask, 0.125)
            t1 = time.perf_counter()
            _attend_block(q, k, v, mask, 0.125, 0.0)
            times["plain"].append(t1 - t0)
            times["invariant"].append(time.perf_counter() - t1)
        med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
        rows.append({"new_tokens": n, "keys": width, "plain_us": round(med["plain"]),
                     "invariant_us": round(med["invariant"]), "ratio": round(med["invariant"] / med["plain"], 2)})
    return rows


if __name__ == "__main__":
    print(json.dumps({"threads": torch.get_num_threads(), "rows": main()}, indent=1))
