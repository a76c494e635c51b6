import sys, time, torch
import multispec.models.hf as hf
from multispec.api import load_model
from multispec.models.default import TARGET_NAME
exact = {int(x) for x in sys.argv[1].split(",")}
orig = hf.bucket
hf.bucket = lambda k: k if k in exact else orig(k)
m = load_model(TARGET_NAME, dtype="bfloat16", compile=True)
gen = torch.Generator().manual_seed(0)
cache = m.new_cache()
m.forward(cache, torch.randint(m.vocab_size, (1, 300), generator=gen))
for k in sorted(exact):
    t0 = time.perf_counter()
    m.forward(cache, torch.randint(m.vocab_size, (1, k), generator=gen)); m.crop(cache, 300)
    print("shape", k, "first call", round(time.perf_counter() - t0), "s", flush=True)
ks = [1, 2, 3, 4, 5, 6, 7, 8]
times = {k: [] for k in ks}
for _ in range(7):
    for k in ks:
        tok = torch.randint(m.vocab_size, (1, k), generator=gen)
        t0 = time.perf_counter(); m.forward(cache, tok); times[k].append(time.perf_counter() - t0); m.crop(cache, 300)
import statistics
print({k: round(1e3 * statistics.median(v), 2) for k, v in times.items()}, m.kernels)
