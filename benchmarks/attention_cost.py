"""What batch-invariant attention costs: `multispec.models.static._attend_block` (at least 16 query rows per
key head, the normaliser as a column of ones in the values product, keys summed in whole blocks of slots,
over the float32 cache `StaticKV` holds) against a plain float32 softmax attention over a bfloat16 cache and
against torch's fused `scaled_dot_product_attention` in bfloat16 (transformers' default), interleaved in one
process, per layer of the default target's shape (9 query heads, 3 key heads, head dim 64).

    python benchmarks/attention_cost.py > attention-cost.json
"""

import json
import statistics
import time

import torch

from multispec.models.static import _attend_block, whole_blocks, with_ones


def plain(query, keys, values, mask, scaling):
    b, hq, n, d = query.shape
    hk = keys.shape[1]
    group = hq // hk
    q = query.float().reshape(b, hk, group * n, d)
    scores = (torch.matmul(q, keys.float().transpose(-1, -2)) * scaling).view(b, hk, group, n, -1)
    scores = scores + mask.float()[:, :, None]
    probs = torch.softmax(scores, -1).view(b, hk, group * n, -1)
    return torch.matmul(probs, values.float()).view(b, hq, n, -1).to(query.dtype)


def sdpa(query, keys, values, mask, scaling):
    return torch.nn.functional.scaled_dot_product_attention(
        query, keys, values, mask.to(query.dtype), scale=scaling, enable_gqa=True
    )


def main(repeats: int = 30) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for n, width in ((1, 300), (1, 600), (5, 600), (16, 600), (5, 1200)):
        q = torch.randn(1, 9, n, 64, generator=gen).bfloat16()
        k, v = (torch.randn(1, 3, width, 64, generator=gen).bfloat16() for _ in range(2))
        mask = torch.zeros(1, 1, n, width)
        # the static cache's layout: float32, whole blocks of slots, values beside ones, padding masked
        span = whole_blocks(width)
        k32 = torch.nn.functional.pad(k.float(), (0, 0, 0, span - width))
        v32 = with_ones(torch.nn.functional.pad(v, (0, 0, 0, span - width)))
        mask32 = torch.nn.functional.pad(mask, (0, span - width), value=torch.finfo(torch.float32).min)
        times = {"sdpa_bf16": [], "plain": [], "invariant": []}
        for _ in range(repeats):
            t0 = time.perf_counter()
            sdpa(q, k, v, mask, 0.125)
            t1 = time.perf_counter()
            plain(q, k, v, mask, 0.125)
            t2 = time.perf_counter()
            _attend_block(q, k32, v32, mask32, 0.125, 0.0)
            t3 = time.perf_counter()
            times["sdpa_bf16"].append(t1 - t0)
            times["plain"].append(t2 - t1)
            times["invariant"].append(t3 - t2)
        med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
        rows.append(
            {
                "new_tokens": n,
                "keys": width,
                "sdpa_bf16_us": round(med["sdpa_bf16"]),
                "plain_us": round(med["plain"]),
                "invariant_us": round(med["invariant"]),
                "invariant_over_plain": round(med["invariant"] / med["plain"], 2),
            }
        )
    return rows


if __name__ == "__main__":
    print(json.dumps({"threads": torch.get_num_threads(), "rows": main()}, indent=1))
