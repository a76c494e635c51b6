"""The default target's compiled step in the kept `dpbf16` variant against the variant session 48 kept for the
same width (`onednn+concat` at 1 and 4 tokens, `autotuned+concat` at 16), in one process, on the same caches:
the kept one loaded, the other compiled here under the same key and removed after. Interleaved rounds, median per
cell; the largest logit difference between the two, bfloat16."""

import statistics
import time

import torch

from multispec.models import packaged
from multispec.models.default import load_default

BEFORE = {1: "onednn+concat", 4: "onednn+concat", 16: "autotuned+concat"}
CONTEXTS = (128, 1024)
ROUNDS = 30


def main() -> None:
    model = load_default(compile=True)
    torch.manual_seed(0)
    steps = {}
    with torch.inference_mode():
        for width, other in BEFORE.items():
            shape = (1, width)
            cache = model.new_cache()
            model.forward(cache, torch.randint(1000, (1, 64)), logits_to_keep=1)
            model.forward(cache, torch.randint(1000, (1, width)))  # loads (or chooses) the kept variant
            kept = model.kernels[shape]
            assert kept != other, (width, kept)
            model.kernels[shape] = other
            model.forward(cache, torch.randint(1000, (1, width)))  # compiles the other
            model.kernels[shape] = kept
            steps[width] = (kept, {other: model._packages.pop((other, shape)), kept: model._packages[(kept, shape)]})
            packaged.remove(packaged.path_for(model._package_key(), other, shape))
        print("| width | cached | before, ms | kept, ms | kept / before | largest logit difference |")
        print("|---|---|---|---|---|---|")
        for width, other in BEFORE.items():
            kept, pair = steps[width]
            for context in CONTEXTS:
                cache = model.new_cache()
                model.forward(cache, torch.randint(1000, (1, context)), logits_to_keep=1)
                tokens = torch.randint(1000, (1, width))
                times = {k: [] for k in pair}
                logits = {}
                for r in range(ROUNDS + 2):
                    for name, step in pair.items():
                        model._packages[(kept, (1, width))] = step
                        start = time.perf_counter()
                        logits[name] = model.forward(cache, tokens)
                        if r >= 2:
                            times[name].append(time.perf_counter() - start)
                        model.crop(cache, context)
                model._packages[(kept, (1, width))] = pair[kept]
                ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
                diff = (logits[other].float() - logits[kept].float()).abs().max().item()
                print(f"| {width} ({other} / {kept}) | {context} | {ms[other]:.2f} | {ms[kept]:.2f} | "
                      f"{ms[kept] / ms[other]:.2f} | {diff:.3f} |", flush=True)


if __name__ == "__main__":
    main()
