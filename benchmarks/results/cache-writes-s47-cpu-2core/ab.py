"""The compiled target step before and after writing whole value entries into the cache buffer (STEP_VERSION 2),
in one process, on the same caches: the old packages are loaded from disk under the old key (without
`|step=2`) and swapped in for the new ones. Interleaved rounds, median per cell."""

import statistics
import time

import torch

from multispec.models import packaged
from multispec.models.default import load_default

WIDTHS = (1, 16)
CAPACITIES = (512, 2048, 4096)
CONTEXTS = (128, 900)
ROUNDS = 25


def main() -> None:
    model = load_default(compile=True)
    torch.manual_seed(0)
    old_key = model._package_key().replace("|step=2", "")
    steps = {}
    with torch.inference_mode():
        for width in WIDTHS:
            cache = model.new_cache()
            model.forward(cache, torch.randint(1000, (1, 64)), logits_to_keep=1)
            model.forward(cache, torch.randint(1000, (1, width)))  # compiles or loads the new step
            kind = model.kernels[(1, width)]
            new = model._packages[(kind, (1, width))]
            old = None
            for old_kind in ("onednn", "autotuned"):
                old = packaged.load(packaged.path_for(old_key, old_kind, (1, width)))
                if old is not None:
                    break
            steps[width] = {"old": (old_kind, old), "new": (kind, new)}
        print("| width | capacity | cached | old step, ms | new step, ms | new / old |")
        print("|---|---|---|---|---|---|")
        for width in WIDTHS:
            for capacity in CAPACITIES:
                for context in CONTEXTS:
                    cache = model.new_cache()
                    cache.reserve(capacity)
                    model.forward(cache, torch.randint(1000, (1, context)), logits_to_keep=1)
                    tokens = torch.randint(1000, (1, width))
                    times = {"old": [], "new": []}
                    for r in range(ROUNDS + 2):
                        for name in ("old", "new"):
                            model._packages[(steps[width]["new"][0], (1, width))] = steps[width][name][1]
                            start = time.perf_counter()
                            model.forward(cache, tokens)
                            if r >= 2:
                                times[name].append(time.perf_counter() - start)
                            cache.crop(context)
                    old, new = (1e3 * statistics.median(times[k]) for k in ("old", "new"))
                    print(f"| {width} | {cache.capacity} | {context} | {old:.2f} | {new:.2f} | {new / old:.2f} |",
                          flush=True)
        print("kernels: " + ", ".join(f"width {w}: old {s['old'][0]}, new {s['new'][0]}" for w, s in steps.items()))


if __name__ == "__main__":
    main()
