"""tree=auto's work besides forwards with every scheduled search (the old rule) against searches only on news,
alternating in one process: one Spec-Bench translation prompt, greedy, 96 tokens, the default pair as loaded."""
import json
import statistics
import sys

import multispec.drafting.shape as shape
from multispec.api import generate, load_pair
from multispec.bench.prompts import load_prompts

pair = load_pair()
prompt = load_prompts(["spec-bench-dev"], ["translation"], 1, True)[0]
ids = pair.target.encode(prompt.text)
news = shape.AutoTree._news
rows = {"every scheduled search": [], "searches on news": []}
for rep in range(4):
    for label in rows:
        shape.AutoTree._news = (lambda self, context: True) if label.startswith("every") else news
        r = generate(pair.target, pair.draft, ids, method="mcsd:tree=auto", temperature=0, max_new_tokens=96,
                     seed=0, score=False)
        st = r.stats
        if rep:  # the first round warms up
            rows[label].append({"other_ms_per_call": 1e3 * st["other_seconds"] / st["target_calls"],
                                "searches": st["tree_searches"], "trees_used": st["trees_used"],
                                "tokens": r.token_ids})
same = rows["every scheduled search"][0]["tokens"] == rows["searches on news"][0]["tokens"]
for label, rs in rows.items():
    print(f"{label}: other {statistics.median(r['other_ms_per_call'] for r in rs):.2f} ms/call "
          f"({[round(r['other_ms_per_call'], 2) for r in rs]}), searches {rs[0]['searches']}, "
          f"trees {rs[0]['trees_used']}")
print("same tokens:", same)
json.dump({k: [{kk: vv for kk, vv in r.items() if kk != "tokens"} for r in v] for k, v in rows.items()},
          sys.stdout if len(sys.argv) < 2 else open(sys.argv[1], "w"))
