"""Does ar's step time drift within a process after the cost curve is measured (tune's bias)?"""
import time

from multispec.api import generate, load_pair
from multispec.bench import load_prompts
from multispec.models.cost import forward_cost, padded_tokens

pair = load_pair(compile=True)
prompts = load_prompts(["mt-bench"], None, None, spread=True)[:10]
t0 = time.perf_counter()
cost = forward_cost(pair.target, here=padded_tokens(pair.target) > 0)
print(f"curve measured in {time.perf_counter() - t0:.1f} s: T(1,128) {cost(1, 128)*1e3:.2f} ms, T(1,1024) {cost(1, 1024)*1e3:.2f}")
for rnd in range(3):
    for i, p in enumerate(prompts):
        n = len(pair.target.encode(p.text))
        r = generate(pair.target, pair.draft, p.text, method="ar", max_new_tokens=128, temperature=1.0, seed=i,
                     score=False)
        st = r.stats
        c = n + st["new_tokens"] // 2
        step = (st["target_seconds"] - st["prefill_seconds"]) / max(1, st["target_calls"] - 1)
        print(f"round {rnd} prompt {i} ({n} tokens): {step*1e3:.2f} ms/step, curve {cost(1, c)*1e3:.2f}, "
              f"ratio {step / cost(1, c):.2f}, other {st['other_seconds']/st['target_calls']*1e3:.2f} ms, "
              f"tok/s {st['new_tokens']/st['seconds']:.1f}", flush=True)
