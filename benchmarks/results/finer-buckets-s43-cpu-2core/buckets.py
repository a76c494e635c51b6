"""Time the compiled target's forwards over 1-8 new tokens with the counts given (e.g. 3,5,6) in graphs of
their own instead of the next power of two (`hf.bucket` patched)."""

import statistics
import sys
import time

import torch

import multispec.models.hf as hf
from multispec.api import load_model
from multispec.models.default import TARGET_NAME

exact = {int(x) for x in sys.argv[1].split(",")}
power_of_two = hf.bucket
hf.bucket = lambda k: k if k in exact else power_of_two(k)
model = load_model(TARGET_NAME, dtype="bfloat16", compile=True)
gen = torch.Generator().manual_seed(0)
cache = model.new_cache()
model.forward(cache, torch.randint(model.vocab_size, (1, 300), generator=gen))


def timed_forward(k: int) -> float:
    tokens = torch.randint(model.vocab_size, (1, k), generator=gen)
    t0 = time.perf_counter()
    model.forward(cache, tokens)
    seconds = time.perf_counter() - t0
    model.crop(cache, 300)
    return seconds


for k in sorted(exact):  # compiles the shape and chooses its kernel
    print("shape", k, "first call", round(timed_forward(k)), "s", flush=True)
counts = [1, 2, 3, 4, 5, 6, 7, 8]
times = {k: [] for k in counts}
for _ in range(7):
    for k in counts:
        times[k].append(timed_forward(k))
print({k: round(1e3 * statistics.median(v), 2) for k, v in times.items()}, model.kernels)
