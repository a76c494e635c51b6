"""ar steps over 3 rounds of 10 prompts in one process, with the process's huge-page counters (smaps_rollup)."""
import os
import time

from multispec.api import generate, load_pair
from multispec.bench import load_prompts

pair = load_pair(compile=True)
prompts = load_prompts(["mt-bench"], None, None, spread=True)[:10]
def smaps():
    out = {}
    for line in open(f"/proc/{os.getpid()}/smaps_rollup"):
        k, v = line.split(":", 1)
        if k in ("Rss", "AnonHugePages", "FilePmdMapped", "ShmemPmdMapped", "Anonymous"):
            out[k] = int(v.split()[0]) // 1024
    return out
t0 = time.perf_counter()
for rnd in range(3):
    for i, p in enumerate(prompts):
        r = generate(pair.target, pair.draft, p.text, method="ar", max_new_tokens=128, temperature=1.0, seed=i, score=False)
        st = r.stats
        step = (st["target_seconds"] - st["prefill_seconds"]) / max(1, st["target_calls"] - 1)
        if i % 3 == 0:
            print(f"{time.perf_counter()-t0:6.1f}s round {rnd} prompt {i}: {step*1e3:.2f} ms/step {smaps()}", flush=True)
