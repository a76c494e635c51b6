import torch

from multispec import generate, load_pair
from multispec.bench.prompts import load_prompts

pair = load_pair(dtype="bfloat16")
p = [p for p in load_prompts(["mt-bench", "spec-bench-dev"], None, 50, True) if p.id == "spec_bench_dev:545"][0]
ids = pair.target.encode(p.text)
ar = generate(pair.target, None, ids, method="ar", temperature=0, max_new_tokens=48, score=False).token_ids
mc = generate(pair.target, pair.draft, ids, method="mcsd", temperature=0, max_new_tokens=48, score=False).token_ids
first = next(i for i, (a, b) in enumerate(zip(ar, mc, strict=False)) if a != b)
print("prompt tokens", len(ids), "first diff", first, "ar", ar[first], "mcsd", mc[first])
t = pair.target
# the logits at the diverging position: one full forward of the prefix (eager), and ar-style one-token steps
prefix = torch.tensor([ids + ar[:first]])
cache = t.new_cache()
full = t.forward(cache, prefix, logits_to_keep=1)[0, -1].float()
top = torch.topk(full, 3)
print("prefix forward top3", top.values.tolist(), top.indices.tolist())
cache = t.new_cache()
t.forward(cache, torch.tensor([ids + ar[:first - 1]]), logits_to_keep=1)
step = t.forward(cache, torch.tensor([[ar[first - 1]]]), logits_to_keep=1)[0, -1].float()
top = torch.topk(step, 3)
print("one-token step top3", top.values.tolist(), top.indices.tolist())
for k in (2, 4, 8):
    cache = t.new_cache()
    t.forward(cache, torch.tensor([ids + ar[:first - 1]]), logits_to_keep=1)
    out = t.forward(cache, torch.tensor([[ar[first - 1]] + [ar[first]] * (k - 1)]), logits_to_keep=k)[0, 0].float()
    top = torch.topk(out, 3)
    print(f"{k}-token forward, row 0 top3", top.values.tolist(), top.indices.tolist())
