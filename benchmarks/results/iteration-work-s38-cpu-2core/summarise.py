"""Per method in each bench results.jsonl: tokens/s (sum of tokens / sum of seconds), and per target call the
block efficiency and the target, draft and other milliseconds.

    python summarise.py before/results.jsonl after/results.jsonl ...
"""
import json
import sys

for path in sys.argv[1:]:
    rows = [json.loads(line) for line in open(path)]
    by_method: dict[str, list[dict]] = {}
    for row in rows:
        by_method.setdefault(row["method"], []).append(row)
    print(path)
    for method, rs in by_method.items():
        tokens, seconds = sum(r["new_tokens"] for r in rs), sum(r["seconds"] for r in rs)
        calls = sum(r["target_calls"] for r in rs)
        per_call = {k: sum(r[k] for r in rs) / calls * 1e3 for k in ("target_seconds", "draft_seconds", "other_seconds")}
        print(f"  {method:30s} {tokens / seconds:6.1f} tok/s  BE {tokens / calls:.2f} target {per_call['target_seconds']:.1f}"
              f" draft {per_call['draft_seconds']:.1f} other {per_call['other_seconds']:.2f} ms/call")
