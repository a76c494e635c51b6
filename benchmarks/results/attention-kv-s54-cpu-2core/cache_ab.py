"""The default target's compiled step with its cache in bfloat16 and in float32, interleaved in one process:
T(k, c), the median of 7 rounds of 2 timed calls after one untimed, the order of the two caches alternating."""

import statistics
import time

import torch

from multispec.api import load_model
from multispec.models import static
from multispec.models.default import TARGET_NAME

model = load_model(TARGET_NAME, dtype="bfloat16", compile=True)
model.prepare()
print("storage", model.kv_storage())
gen = torch.Generator().manual_seed(0)
STORAGES = (torch.bfloat16, torch.float32)
CONTEXTS = (128, 1024)
KS = (1, 4, 16, 32)
caches = {}
for storage in STORAGES:
    for c in CONTEXTS:
        kv = static.StaticKV(model.kv_shapes, model.dtype, model.device, storage=storage)
        model.forward(kv, torch.randint(model.vocab_size, (1, c), generator=gen), logits_to_keep=1)
        caches[(storage, c)] = kv
tokens = {k: torch.randint(model.vocab_size, (1, k), generator=gen) for k in KS}
for (_, c), kv in caches.items():  # first use of each shape
    for k in KS:
        model.forward(kv, tokens[k])
        model.crop(kv, c)
times = {key + (k,): [] for key in caches for k in KS}
for round_ in range(7):
    for c in CONTEXTS:
        for k in KS:
            for storage in STORAGES if round_ % 2 else STORAGES[::-1]:
                kv = caches[(storage, c)]
                for rep in range(3):
                    t0 = time.perf_counter()
                    model.forward(kv, tokens[k])
                    seconds = time.perf_counter() - t0
                    model.crop(kv, c)
                    if rep:
                        times[(storage, c, k)].append(seconds)
for c in CONTEXTS:
    for k in KS:
        half, full = (statistics.median(times[(s, c, k)]) * 1e3 for s in STORAGES)
        print(f"c={c} k={k}: bf16 cache {half:.2f} ms, float32 cache {full:.2f} ms, ratio {half / full:.3f}")
