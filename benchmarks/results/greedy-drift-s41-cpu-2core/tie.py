import torch

import multispec.decoding.tree as tm
from multispec import generate, load_pair
from multispec.bench.prompts import load_prompts

pair = load_pair(dtype="bfloat16")
p = [p for p in load_prompts(["mt-bench", "spec-bench-dev"], None, 50, True) if p.id == "spec_bench_dev:545"][0]
ids = pair.target.encode(p.text)
calls = []
orig_argmax, orig_verify = tm.argmax, tm.greedy_tree_verify
def cap_argmax(logits):
    calls.append({"logits": logits.detach().clone()})
    return orig_argmax(logits)
def cap_verify(tree, tokens, target_tokens, *a, **k):
    v = orig_verify(tree, tokens, target_tokens, *a, **k)
    calls[-1].update(tree=tree, tokens=tokens.tolist(), verdict=v)
    return v
tm.argmax, tm.greedy_tree_verify = cap_argmax, cap_verify
mc = generate(pair.target, pair.draft, ids, method="mcsd", temperature=0, max_new_tokens=48, score=False).token_ids
emitted = 0
for c in calls:
    v = c["verdict"]
    n = len(v.accepted) + (1 if v.next_token is not None else 0)
    if emitted <= 36 < emitted + n:
        j = 36 - emitted  # index within this iteration's output
        node = -1 if j == 0 else v.accepted[j - 1]
        row = c["logits"][1 + node].float()
        top = torch.topk(row, 3)
        print("iteration emitted", emitted, "tree size", c["tree"].size, "accepted", v.accepted, "next", v.next_token,
              "row", 1 + node, "top3", top.values.tolist(), top.indices.tolist(), "dtype", c["logits"].dtype,
              "shape", tuple(c["logits"].shape))
    emitted += n
print("mcsd[36]", mc[36])
