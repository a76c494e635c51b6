"""tree=auto with the chain proposer for the chains it picks, against the tree proposer for every tree, and `sd`
gamma 1: 20 prompts (10 MT-Bench, 10 Spec-Bench dev, spread), 128 tokens, compiled, T = 0 and 1, one process,
prompt by prompt (the order reversed every other prompt). No prior from tune. Run from the repository root."""

import multispec.drafting.shape as shape
from multispec.api import generate, load_pair
from multispec.bench import load_prompts

LABELS = ("auto-chain", "auto-tree-only", "sd1")
original_init = shape.AutoTree.__init__
mode = {"chain": True}


def init(self, *args, **kwargs):
    if not mode["chain"]:
        kwargs["chain"] = None  # the tree proposer for every tree, as before
    original_init(self, *args, **kwargs)


def method(label):
    return ("sd", {"gamma": 1}) if label == "sd1" else ("mcsd", {"tree": "auto"})


def main():
    shape.AutoTree.__init__ = init
    pair = load_pair(compile=True)
    prompts = (load_prompts(["mt-bench"], None, None, spread=True)[:10]
               + load_prompts(["spec-bench-dev"], None, None, spread=True)[:10])
    for t in (0.0, 1.0):
        for label in LABELS:  # warm-up
            mode["chain"] = label != "auto-tree-only"
            name, params = method(label)
            generate(pair.target, pair.draft, prompts[0].text, method=name, max_new_tokens=8, temperature=t, seed=0,
                     **params)
        totals = {label: [0, 0.0, 0, 0.0] for label in LABELS}  # tokens, seconds, target calls, other seconds
        for i, prompt in enumerate(prompts):
            for label in LABELS if i % 2 == 0 else LABELS[::-1]:
                mode["chain"] = label != "auto-tree-only"
                name, params = method(label)
                st = generate(pair.target, pair.draft, prompt.text, method=name, max_new_tokens=128, temperature=t,
                              seed=i, score=False, **params).stats
                for j, key in enumerate(("new_tokens", "seconds", "target_calls", "other_seconds")):
                    totals[label][j] += st[key]
        for label in LABELS:
            n, seconds, calls, other = totals[label]
            print(f"T={t:g} {label:15s} {n / seconds:7.1f} tok/s  block eff {n / calls:.2f}  "
                  f"other {other / calls * 1000:.2f} ms/call", flush=True)


if __name__ == "__main__":
    main()
