"""cProfile of sd gamma 1 against tree=auto (the math_reasoning-T0 plan's spec of run 1) on 4 held-out math
prompts, 128 tokens: `python profile_auto.py 0` (the temperature). Prints each method's time split per target
call and its top functions by own time."""

import cProfile
import io
import pstats
import sys

from multispec.api import generate, load_pair
from multispec.bench import load_prompts

pair = load_pair(compile=True)
prompts = load_prompts(["spec-bench-dev"], ["math_reasoning"], None)[10:14]
temperature = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
methods = {"sd1": "sd:gamma=1,drafter=model",
           "auto": "mcsd:tree=auto,acceptance=0.474/0.246/0.149/0.153/0.071/0.061/0.048/0.042,"
                   "overhead=0.914/0.1005/0.264,factors=0.953/1.015/0.886/0.798/1.098,replacement=false"}
for spec in methods.values():  # loads, first calls
    generate(pair.target, pair.draft, prompts[0].text, method=spec, max_new_tokens=16, temperature=temperature,
             seed=0, score=False)
for name, spec in methods.items():
    profile = cProfile.Profile()
    total = dict.fromkeys(("new_tokens", "target_calls", "other_seconds", "target_seconds", "draft_seconds"), 0.0)
    profile.enable()
    for i, p in enumerate(prompts):
        stats = generate(pair.target, pair.draft, p.text, method=spec, max_new_tokens=128, temperature=temperature,
                         seed=i, score=False).stats
        for key in total:
            total[key] += stats[key]
    profile.disable()
    calls = total["target_calls"]
    print(f"== {name}: BE {total['new_tokens'] / calls:.2f} other {total['other_seconds'] / calls * 1e3:.2f} "
          f"ms/call target {total['target_seconds'] / calls * 1e3:.2f} draft {total['draft_seconds'] / calls * 1e3:.2f}"
          f" trees {stats.get('trees_used')}")
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
    print("\n".join(out.getvalue().splitlines()[:45]))
