"""The table of README.md from bench0-results.jsonl: medians over the prompts, paired ratios against hf."""

import collections
import json
import statistics as st

rows = [json.loads(line) for line in open("bench0-results.jsonl")]
by = collections.defaultdict(list)
for r in rows:
    by[r["method"]].append(r)
hf = {r["prompt_id"]: r for r in by["hf"]}


def med(rs, f):
    v = [x for x in map(f, rs) if x is not None]
    return f"{st.median(v):.2f}" if v else "–"


def steps(r):  # decode forwards of the target (the prefill's one left out)
    return sum(r["target_forwards"].values()) - 1 if isinstance(r.get("target_forwards"), dict) else None


print("| method | tokens/s | / hf (paired) | block eff. | target ms/step | draft ms/call | other ms/iter |")
print("|---|---|---|---|---|---|---|")
for m, rs in by.items():
    print(
        "|",
        " | ".join(
            [
                m,
                med(rs, lambda r: r["tokens_per_second"]),
                med(rs, lambda r: r["tokens_per_second"] / hf[r["prompt_id"]]["tokens_per_second"]),
                med(rs, lambda r: r["block_efficiency"]),
                med(rs, lambda r: 1e3 * (r["target_seconds"] - r["prefill_seconds"]) / steps(r) if steps(r) else None),
                med(
                    rs,
                    lambda r: (
                        1e3 * r["draft_seconds"] / sum(r["draft_forwards"].values())
                        if isinstance(r.get("draft_forwards"), dict) and r["draft_forwards"]
                        else None
                    ),
                ),
                med(rs, lambda r: 1e3 * r["other_seconds"] / steps(r) if steps(r) else None),
            ]
        ),
        "|",
    )
print()
print("| prompt | category | " + " | ".join(by) + " |")
print("|---|---|" + "---|" * len(by))
for p in hf:
    cells = [f"{next(r for r in by[m] if r['prompt_id'] == p)['tokens_per_second']:.1f}" for m in by]
    print(f"| {p} | {hf[p]['category']} | " + " | ".join(cells) + " |")
print()
print("new tokens: " + "; ".join(f"{m}: {[r['new_tokens'] for r in rs]}" for m, rs in by.items()))
