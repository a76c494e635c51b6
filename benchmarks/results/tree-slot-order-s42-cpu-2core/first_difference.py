"""The eager bfloat16 mcsd / ar difference on spec_bench_dev:545: the caches part at position 895, written by
mcsd's tree forward (past 892) and ar's step (past 895). Replay both forwards from their cache snapshots and
report, for each tree row at position 895, the first layer output (attention or MLP) that differs from ar's."""

import torch

from multispec import generate, load_pair
from multispec.bench.prompts import load_prompts

POS = 895
pair = load_pair(dtype="bfloat16")
t = pair.target
p = [p for p in load_prompts(["mt-bench", "spec-bench-dev"], None, 50, True) if p.id == "spec_bench_dev:545"][0]
ids = t.encode(p.text)
orig = type(t).forward


def run(method, draft):
    calls = []

    def fwd(self, cache, tokens, positions=None, mask=None, logits_to_keep=0, **kw):
        if self is t:
            calls.append(
                dict(
                    snap=(
                        [b.clone() for b in cache.key_buffers],
                        [b.clone() for b in cache.value_buffers],
                        cache.positions.clone(),
                        cache.length,
                        cache.capacity,
                    ),
                    args=(
                        tokens.clone(),
                        None if positions is None else positions.clone(),
                        None if mask is None else mask.clone(),
                        logits_to_keep,
                    ),
                    kw=kw,
                )
            )
        return orig(self, cache, tokens, positions, mask, logits_to_keep, **kw)

    type(t).forward = fwd
    try:
        generate(t, draft, ids, method=method, temperature=0, max_new_tokens=48, score=False)
    finally:
        type(t).forward = orig
    return calls


def restore(c):
    k, v, pos, length, cap = c["snap"]
    cache = t.new_cache()
    cache.reserve(cap)
    with torch.inference_mode():
        for b, s in zip(cache.key_buffers, k, strict=False):
            b.copy_(s)
        for b, s in zip(cache.value_buffers, v, strict=False):
            b.copy_(s)
        cache.positions.copy_(pos)
    cache.length = length
    return cache


A = run("ar", None)
M = run("mcsd", pair.draft)
ca = [c for c in A if c["snap"][3] == POS][0]
cm = [c for c in M if c["snap"][3] <= POS][-1]
pm = cm["snap"][3]
pos_m = cm["args"][1][0] if cm["args"][1] is not None else torch.arange(pm, pm + cm["args"][0].shape[1])
rows_m = (pos_m == POS).nonzero().flatten().tolist()
print(
    "mcsd call past",
    pm,
    "rows at position",
    POS,
    rows_m,
    "tokens",
    [int(cm["args"][0][0, r]) for r in rows_m],
    "ar token",
    int(ca["args"][0][0, 0]),
)
# which of those rows is the accepted one: the one whose token equals ar's and whose path matches
layers = t.model.model.layers


def capture(c, row):
    got = []
    hooks = []
    for i, L in enumerate(layers):
        hooks.append(
            L.self_attn.register_forward_hook(lambda m, a, o, i=i: got.append(("attn", i, o[0][0, row].clone())))
        )
        hooks.append(L.mlp.register_forward_hook(lambda m, a, o, i=i: got.append(("mlp", i, o[0, row].clone()))))
    cache = restore(c)
    tok, pos, mask, keep = c["args"]
    orig(t, cache, tok, pos, mask, keep, **c["kw"])
    for h in hooks:
        h.remove()
    return got


ga = capture(ca, 0)
for r in rows_m:
    gm = capture(cm, r)
    first = next(((k, i) for (k, i, x), (_, _, y) in zip(ga, gm, strict=False) if not torch.equal(x, y)), None)
    print("row", r, "first differing sublayer output", first)
    # is the tree path of this row the same tokens as ar's?
