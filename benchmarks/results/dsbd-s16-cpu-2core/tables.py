"""The README's tables from bench/results.jsonl: per method, over all 40 prompts and per prompt set, and
peak memory on the long prompts.
Usage: python benchmarks/results/dsbd-s16-cpu-2core/tables.py"""

import json
import math
import statistics
from pathlib import Path

from multispec.bench import metrics

HERE = Path(__file__).parent
BASE = "beam:width=3"


def table(rows: list[dict], title: str) -> None:
    base = {r["prompt_id"]: r for r in rows if r["method"] == BASE and not r["error"]}
    print(f"\n{title}\n")
    print("| method | tokens/s (all tokens / all seconds) | vs beam W=3 (median of per-prompt ratios) | target calls "
          "(mean) | tokens per target call | PPL | ROUGE-L | BLEU | peak MB (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in dict.fromkeys(r["method"] for r in rows):
        ok = [r for r in rows if r["method"] == m and not r["error"]]
        tokens = sum(r["new_tokens"] for r in ok)
        speed = tokens / sum(r["seconds"] for r in ok)
        ratio = statistics.median(r["tokens_per_second"] / base[r["prompt_id"]]["tokens_per_second"]
                                  for r in ok if r["prompt_id"] in base)
        calls = statistics.mean(r["target_calls"] for r in ok)
        ppl = math.exp(-statistics.mean(r["mean_logprob"] for r in ok))
        ref = [r for r in ok if r["reference"] is not None]
        rouge = statistics.mean(r["rouge_l"] for r in ref) if ref else None
        bleu = metrics.corpus_bleu([r["text"] for r in ref], [r["reference"] for r in ref]) if ref else None
        mem = statistics.median(r["peak_memory_mb"] for r in ok)
        print(f"| {m} | {speed:.1f} | {ratio:.2f}x | {calls:.1f} | {tokens / sum(r['target_calls'] for r in ok):.2f} "
              f"| {ppl:.2f} | {'–' if rouge is None else f'{rouge:.3f}'} | {'–' if bleu is None else f'{bleu:.1f}'} "
              f"| {mem:.0f} |")


rows = [json.loads(line) for line in (HERE / "bench" / "results.jsonl").read_text().splitlines() if line.strip()]
table(rows, "All 40 prompts")
table([r for r in rows if r["prompt_id"].startswith("mt_bench")], "MT-Bench (20)")
table([r for r in rows if not r["prompt_id"].startswith("mt_bench")], "Spec-Bench dev (20)")

long = [r for r in rows if r["prompt_tokens"] > 500 and not r["error"]]
print(f"\nPeak MB on the {len({r['prompt_id'] for r in long})} prompts of more than 500 tokens (median, min-max)\n")
print("| method | peak MB |\n|---|---|")
for m in dict.fromkeys(r["method"] for r in long):
    mem = [r["peak_memory_mb"] for r in long if r["method"] == m]
    print(f"| {m} | {statistics.median(mem):.0f} ({min(mem):.0f}-{max(mem):.0f}) |")
