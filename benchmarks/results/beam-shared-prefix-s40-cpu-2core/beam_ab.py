"""beam widths 2 and 3 on 8 long prompts (4 summarisation, 4 RAG; 128 tokens, greedy, compiled) with the shared-prefix reorder, and with every reorder copying
the whole cache (session 39's behaviour, by clearing `shared` before each reorder), alternating, one process."""
import sys
from multispec.api import generate, load_pair
from multispec.bench import load_prompts
from multispec.models.static import StaticKV

pair = load_pair(compile=True)
prompts = load_prompts(["spec-bench-dev"], ["summarization"], None)[:4] + load_prompts(["spec-bench-dev"], ["rag"], None)[:4]
original = StaticKV.select_rows

def full_copy(self, rows):
    self.shared = 0
    return original(self, rows)

specs = [("beam:width=2", 0.0), ("beam:width=3", 0.0)]
for spec, t in specs:
    generate(pair.target, pair.draft, prompts[0].text, method=spec, max_new_tokens=16, temperature=t, seed=0, score=False)
for spec, t in specs:
    tot = {"shared": [0, 0.0, []], "full": [0, 0.0, []]}
    for i, p in enumerate(prompts):
        for mode in ("full", "shared"):
            StaticKV.select_rows = full_copy if mode == "full" else original
            r = generate(pair.target, pair.draft, p.text, method=spec, max_new_tokens=128, temperature=t, seed=i, score=False)
            tot[mode][0] += r.stats["new_tokens"]; tot[mode][1] += r.stats["seconds"]; tot[mode][2].append(r.token_ids)
    StaticKV.select_rows = original
    same = sum(a == b for a, b in zip(tot["full"][2], tot["shared"][2]))
    print(f"{spec}: full copy {tot['full'][0]/tot['full'][1]:.1f} tok/s, shared prefix {tot['shared'][0]/tot['shared'][1]:.1f} tok/s, "
          f"ratio {tot['shared'][0]/tot['shared'][1]/(tot['full'][0]/tot['full'][1]):.2f}, identical outputs {same}/{len(prompts)}", flush=True)
