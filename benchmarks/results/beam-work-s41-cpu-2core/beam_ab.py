"""mjsd and mtad with the beam drafter's by-row picks and draws (`BeamDraft.heaviest` / `drawn`), and without
them (the pass over all W x V extensions, by switching the two properties off), alternating prompt by prompt
in one process: 16 prompts of the 60-prompt set (engine-methods-s40, every fourth), 128 tokens, compiled,
T = 0 and 1, the same seed for both variants."""

import json
import sys

from multispec.api import generate, load_pair
from multispec.bench import load_prompts
from multispec.drafting.beams import BeamDraft

pair = load_pair(compile=True)
prompts = load_prompts(["../engine-methods-s40-cpu-2core/prompts.jsonl"], None, None)[::4]
by_row = {name: getattr(BeamDraft, name) for name in ("_by_row_candidates", "_by_row_draws")}
off = property(lambda self: False)


def variant(mode: str) -> None:
    for name, prop in by_row.items():
        setattr(BeamDraft, name, prop if mode == "by-row" else off)


rows = []
for spec in ("mjsd", "mtad"):
    for t in (0.0, 1.0):
        generate(pair.target, pair.draft, prompts[0].text, method=spec, max_new_tokens=16, temperature=t, seed=0,
                 score=False)  # loads and first calls
        for i, p in enumerate(prompts):
            out = {}
            for mode in (("all", "by-row") if i % 2 else ("by-row", "all")):
                variant(mode)
                r = generate(pair.target, pair.draft, p.text, method=spec, max_new_tokens=128, temperature=t, seed=i,
                             score=False)
                st = r.stats
                out[mode] = r.token_ids
                rows.append({"method": spec, "temperature": t, "prompt": p.id, "variant": mode,
                             "new_tokens": st["new_tokens"], "seconds": st["seconds"],
                             "iterations": st["iterations"], "other_seconds": st["other_seconds"],
                             "target_seconds": st["target_seconds"], "draft_seconds": st["draft_seconds"]})
            rows[-1]["same_tokens"] = rows[-2]["same_tokens"] = out["all"] == out["by-row"]
        for mode in ("all", "by-row"):
            sel = [r for r in rows if r["method"] == spec and r["temperature"] == t and r["variant"] == mode]
            new, sec = sum(r["new_tokens"] for r in sel), sum(r["seconds"] for r in sel)
            its, other = sum(r["iterations"] for r in sel), sum(r["other_seconds"] for r in sel)
            print(f"{spec} T={t:g} {mode:6s}: {new / sec:6.1f} tokens/s, other {1e3 * other / its:5.2f} ms/iteration, "
                  f"same tokens {sum(r['same_tokens'] for r in sel)}/{len(sel)}", flush=True)
variant("by-row")
with open(sys.argv[1] if len(sys.argv) > 1 else "rows.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
