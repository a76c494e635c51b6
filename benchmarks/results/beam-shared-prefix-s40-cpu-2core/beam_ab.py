"""beam widths 2 and 3 on 8 long prompts (4 summarisation, 4 RAG; 128 tokens, greedy, compiled) with the
shared-prefix reorder, and with every reorder copying the whole cache (session 39's behaviour, by clearing
`shared` before each reorder), alternating prompt by prompt, one process."""

from multispec.api import generate, load_pair
from multispec.bench import load_prompts
from multispec.models.static import StaticKV

pair = load_pair(compile=True)
prompts = (load_prompts(["spec-bench-dev"], ["summarization"], None)[:4]
           + load_prompts(["spec-bench-dev"], ["rag"], None)[:4])
original = StaticKV.select_rows


def full_copy(self, rows):
    self.shared = 0
    return original(self, rows)


specs = [("beam:width=2", 0.0), ("beam:width=3", 0.0)]
for spec, t in specs:  # loads and first calls
    generate(pair.target, pair.draft, prompts[0].text, method=spec, max_new_tokens=16, temperature=t, seed=0,
             score=False)
for spec, t in specs:
    tokens, seconds, outputs = {"full": 0, "shared": 0}, {"full": 0.0, "shared": 0.0}, {"full": [], "shared": []}
    for i, p in enumerate(prompts):
        for mode in ("full", "shared"):
            StaticKV.select_rows = full_copy if mode == "full" else original
            r = generate(pair.target, pair.draft, p.text, method=spec, max_new_tokens=128, temperature=t, seed=i,
                         score=False)
            tokens[mode] += r.stats["new_tokens"]
            seconds[mode] += r.stats["seconds"]
            outputs[mode].append(r.token_ids)
    StaticKV.select_rows = original
    speed = {mode: tokens[mode] / seconds[mode] for mode in tokens}
    same = sum(a == b for a, b in zip(outputs["full"], outputs["shared"], strict=True))
    print(f"{spec}: full copy {speed['full']:.1f} tok/s, shared prefix {speed['shared']:.1f} tok/s, "
          f"ratio {speed['shared'] / speed['full']:.2f}, identical outputs {same}/{len(prompts)}", flush=True)
