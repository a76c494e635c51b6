"""The batch-invariant attention on random data of the default target's shapes (3 key heads, 3 queries each,
head dim 64, 892 cached slots, 29 new tokens): (M) a row alone vs the same row among 29, same slots; (L) the
same 29 rows with the new tokens' keys and values moved to other slots (as a tree places its nodes)."""

import torch

from multispec.models import static

torch.manual_seed(0)
hk, group, d = 3, 3, 64
past = 892
cap = 1024
ntree = 29
keys = torch.randn(1, hk, cap, d)
vals = static.with_ones(torch.randn(1, hk, cap, d))
minimum = torch.finfo(torch.float32).min


def run(q, width, allowed):
    mask = torch.zeros(allowed.shape).masked_fill_(~allowed, minimum)[None, None]
    return static._attend_block(q, keys[:, :, :width], vals[:, :, : static.whole_blocks(width)], mask, 0.125, 0.0)


trials = 0
diffM = 0
diffL = 0
for trial in range(200):
    q = torch.randn(1, hk * group, ntree, d).to(torch.bfloat16)
    # (M) one row alone vs the same row among 29, same layout (causal chain over past + i)
    allowed = torch.zeros(ntree, past + ntree, dtype=torch.bool)
    allowed[:, :past] = True
    allowed[:, past:] = torch.ones(ntree, ntree, dtype=torch.bool).tril()
    many = run(q, past + ntree, allowed)
    i = trial % ntree
    alone_allowed = torch.zeros(1, past + i + 1, dtype=torch.bool)
    alone_allowed[:] = True
    alone = run(q[:, :, i : i + 1], past + i + 1, alone_allowed)
    diffM += not torch.equal(alone[:, :, 0], many[:, :, i])
    # (L) layout: the chain's row i, vs the same keys placed at other slots (gaps masked), 29 rows both
    # the same chain, node j moved to slot past + 2*j (every other slot, the gaps masked), order kept
    k2, v2 = keys.clone(), vals.clone()
    k2[:, :, past:] = 0
    v2[:, :, past:, :-1] = 0
    for j in range(min(ntree, (cap - past) // 2)):
        k2[:, :, past + 2 * j] = keys[:, :, past + j]
        v2[:, :, past + 2 * j] = vals[:, :, past + j]
    allowed2 = torch.zeros(ntree, past + 2 * ntree, dtype=torch.bool)
    allowed2[:, :past] = True
    for r in range(ntree):
        for j in range(r + 1):
            allowed2[r, past + 2 * j] = True
    mask2 = torch.zeros(allowed2.shape).masked_fill_(~allowed2, minimum)[None, None]
    w = past + 2 * ntree
    spread = static._attend_block(q, k2[:, :, :w], v2[:, :, : static.whole_blocks(w)], mask2, 0.125, 0.0)
    diffL += not torch.equal(spread[:, :, i], many[:, :, i])
    trials += 1
print(
    "trials",
    trials,
    "row alone vs among 29 (same layout) differ:",
    diffM,
    " same rows, nodes at spread slots differ:",
    diffL,
)
print("query_rows", static.query_rows(group, hk, d, d, "cpu"))
