"""transformers' generate on the default target, bf16, greedy, 128 tokens, 4 prompts: a model multispec never
touched, before and after multispec is imported and a compiled pair loaded and run, and the bench's own
`hf_generate` on the pair's target; rounds alternate."""

import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(2)
path = Path.home() / ".cache/multispec/smollm2-135m-instruct-f32"
tok = AutoTokenizer.from_pretrained(path)
prompts = [json.loads(line) for line in open(Path(__file__).parent.parent / "engine-bench-s39-cpu-2core/prompts.jsonl")][:4]
ids = []
for p in prompts:
    x = tok.apply_chat_template(
        [{"role": "user", "content": p["prompt"]}], add_generation_prompt=True, return_tensors="pt"
    )
    ids.append(x if isinstance(x, torch.Tensor) else x["input_ids"])
fresh = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()


def time_fresh(mask=False):
    out = []
    for x in ids:
        kw = {"attention_mask": torch.ones_like(x)} if mask else {}
        with torch.inference_mode():
            t0 = time.perf_counter()
            o = fresh.generate(x, max_new_tokens=128, do_sample=False, **kw)
            s = time.perf_counter() - t0
        out.append((o.shape[1] - x.shape[1]) / s)
    return out


with torch.inference_mode():
    fresh.generate(ids[0], max_new_tokens=8, do_sample=False)
res = {}


def rec(k, v):
    res.setdefault(k, []).append(v)
    print(k, [round(a, 1) for a in v], flush=True)


for _ in range(2):
    rec("fresh, before import", time_fresh())
from multispec import generate, load_pair  # noqa: E402 - imported only after the "before" rounds
from multispec.bench.runner import hf_generate  # noqa: E402
from multispec.warp import Sampling  # noqa: E402

pair = load_pair(dtype="bfloat16", compile=True)
for x in ids[:2]:
    generate(pair.target, pair.draft, x[0].tolist(), method="sd", temperature=0, max_new_tokens=64, score=False)


def time_bench(target):
    out = []
    for x in ids:
        toks, st = hf_generate(target, None, x[0].tolist(), 128, Sampling(temperature=0), 0)
        out.append(len(toks) / st["seconds"])
    return out


hf_generate(pair.target, None, ids[0][0].tolist(), 8, Sampling(temperature=0), 0)
for _ in range(3):
    rec("fresh, after", time_fresh())
    rec("fresh, after, ones mask", time_fresh(mask=True))
    rec("bench hf_generate on pair.target", time_bench(pair.target))
for k, v in res.items():
    print(k, "median per prompt", [round(statistics.median(col), 1) for col in zip(*v, strict=True)])
