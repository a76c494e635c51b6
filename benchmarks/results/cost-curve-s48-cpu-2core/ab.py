"""The default target's compiled step with and without `+concat`, in one process, on the same caches: for each
width, the kept variant (loaded) against its other form (compiled here under the same key and removed after).
Interleaved rounds, median per cell; the largest logit difference between the two, bfloat16."""

import statistics
import time

import torch

from multispec.models import hf, packaged
from multispec.models.default import load_default

WIDTHS = (1, 4, 16)
CONTEXTS = (128, 1024)
ROUNDS = 30


def main() -> None:
    model = load_default(compile=True)
    torch.manual_seed(0)
    steps = {}
    with torch.inference_mode():
        for width in WIDTHS:
            shape = (1, width)
            cache = model.new_cache()
            model.forward(cache, torch.randint(1000, (1, 64)), logits_to_keep=1)
            model.forward(cache, torch.randint(1000, (1, width)))  # loads (or chooses) the kept variant
            kept = model.kernels[shape]
            other = kept.removesuffix(hf.CONCAT) if kept.endswith(hf.CONCAT) else kept + hf.CONCAT
            model.kernels[shape] = other
            model.forward(cache, torch.randint(1000, (1, width)))  # compiles the other form
            model.kernels[shape] = kept
            steps[width] = (kept, {kept: model._packages[(kept, shape)], other: model._packages.pop((other, shape))})
            packaged.remove(packaged.path_for(model._package_key(), other, shape))
        print("| width | cached | without concat, ms | with concat, ms | with / without | largest logit difference |")
        print("|---|---|---|---|---|---|")
        for width in WIDTHS:
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
                plain, = (k for k in ms if not k.endswith(hf.CONCAT))
                fused, = (k for k in ms if k.endswith(hf.CONCAT))
                diff = (logits[plain].float() - logits[fused].float()).abs().max().item()
                print(f"| {width} ({plain} / {fused}) | {context} | {ms[plain]:.2f} | {ms[fused]:.2f} | "
                      f"{ms[fused] / ms[plain]:.2f} | {diff:.3f} |", flush=True)


if __name__ == "__main__":
    main()
