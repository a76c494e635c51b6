"""The default target's compiled step with its cache in bfloat16 and in float32, interleaved in one process
(T(k, c), the median of 7 rounds of 2 timed calls after one untimed)."""
"""target T(k, c) with the cache in bfloat16 and in float32, interleaved in one process."""
import statistics, time, torch
from multispec.api import load_model
from multispec.models import hf
from multispec.models.default import TARGET_NAME
m = load_model(TARGET_NAME, dtype="bfloat16", compile=True)
m.prepare()
print("storage", m.kv_storage())
gen = torch.Generator().manual_seed(0)
caches = {}
for storage in (torch.bfloat16, torch.float32):
    for c in (128, 1024):
        kv = hf.static.StaticKV(m.kv_shapes, m.dtype, m.device, storage=storage)
        m.forward(kv, torch.randint(m.vocab_size, (1, c), generator=gen), logits_to_keep=1)
        caches[(storage, c)] = kv
ks = (1, 4, 16, 32)
toks = {k: torch.randint(m.vocab_size, (1, k), generator=gen) for k in ks}
for (storage, c), kv in caches.items():
    for k in ks:
        m.forward(kv, toks[k]); m.crop(kv, c)
times = {key + (k,): [] for key in caches for k in ks}
for _ in range(7):
    for c in (128, 1024):
        for k in ks:
            for storage in ((torch.bfloat16, torch.float32) if _ % 2 else (torch.float32, torch.bfloat16)):
                kv = caches[(storage, c)]
                for rep in range(3):
                    t = time.perf_counter(); m.forward(kv, toks[k]); dt = time.perf_counter() - t; m.crop(kv, c)
                    if rep: times[(storage, c, k)].append(dt)
for c in (128, 1024):
    for k in ks:
        b, f = (statistics.median(times[(s, c, k)]) * 1e3 for s in (torch.bfloat16, torch.float32))
        print(f"c={c} k={k}: bf16 cache {b:.2f} ms, float32 cache {f:.2f} ms, ratio {b / f:.3f}")
