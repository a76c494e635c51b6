"""Profile of one mjsd call (eager, bf16, qa prompts, 64 tokens): the stats line, then torch ops by self time.

    python benchmarks/results/engine-compiled-s37-cpu-2core/beam-pick/profile.py mjsd 0 > before.txt  (then after.txt)
"""
import sys

import torch

from multispec.api import generate, load_pair
from multispec.bench import load_prompts

method = sys.argv[1] if len(sys.argv) > 1 else "mjsd"
temp = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
pair = load_pair()
target, draft = pair.target, pair.draft
prompts = [x.text for x in load_prompts(["spec-bench-dev"], ["qa"], 3)]
for p in prompts[:1]:
    generate(target, draft, p, method=method, max_new_tokens=32, temperature=temp, seed=0)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for p in prompts[1:3]:
        out = generate(target, draft, p, method=method, max_new_tokens=64, temperature=temp, seed=0)
print(out.stats)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
