"""Session 54: `dpbf16.attend` before this session (one query row at a time), and now (the rows of one key head
in blocks, scores 16 keys at a time) over float32 and over bfloat16 keys and values: bits compared, then per-layer
times at the default target's shapes (9 query heads, 3 key heads, head dim 64), interleaved in one process. The
old kernel is built from git (`abf0953~1`) as a separate extension."""

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils import cpp_extension

from multispec.models import dpbf16

assert dpbf16.unavailable() is None, dpbf16.unavailable()
root = Path(__file__).resolve().parents[3]
old_source = subprocess.run(["git", "show", "abf0953~1:multispec/models/dpbf16.cpp"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
old_source = old_source.replace("TORCH_LIBRARY(multispec_dpbf16,", "TORCH_LIBRARY(attend_before,").replace(
    "TORCH_LIBRARY_IMPL(multispec_dpbf16,", "TORCH_LIBRARY_IMPL(attend_before,")
build = Path(tempfile.mkdtemp())
(build / "before.cpp").write_text(old_source)
cpp_extension.load(name="attend_before", sources=[str(build / "before.cpp")], extra_cflags=dpbf16.FLAGS,
                   extra_ldflags=["-fopenmp"], build_directory=str(build), is_python_module=False, verbose=False)
before, now = torch.ops.attend_before.attend, torch.ops.multispec_dpbf16.attend

gen = torch.Generator().manual_seed(0)
checked = differing = 0
for hq, hk, d in ((9, 3, 64), (8, 2, 128), (4, 4, 64), (6, 2, 32)):
    keys = torch.randn(2, hk, 1200, d, generator=gen).bfloat16().float()
    values = torch.cat([torch.randn(2, hk, 1200, d, generator=gen).bfloat16().float(), torch.ones(2, hk, 1200, 1)], -1)
    for n in (1, 2, 3, 4, 5, 7, 8, 16, 17, 32):
        for c in (0, 100, 1000):
            q = torch.randn(2, hq, n, d, generator=gen).bfloat16()
            mask = torch.zeros(2, 1, n, c + n)
            seen = (torch.rand(2, 1, n, n, generator=gen) < 0.5) | torch.eye(n, dtype=torch.bool)
            mask[..., c:] = torch.where(seen, 0.0, torch.finfo(torch.float32).min)
            for b in (1, 2):
                reference = before(q[:b], keys[:b], values[:b], mask[:b], d, 0.125)
                for k, v in ((keys, values), (keys.bfloat16(), values.bfloat16())):
                    checked += 1
                    differing += not torch.equal(now(q[:b], k[:b], v[:b], mask[:b], d, 0.125), reference)
print(f"outputs with other bits than before: {differing} of {checked} (float32 and bfloat16 keys, trees, 4 shapes)")

keys = torch.randn(1, 3, 1100, 64).bfloat16().float()
values = torch.cat([torch.randn(1, 3, 1100, 64), torch.ones(1, 3, 1100, 1)], -1).bfloat16().float()
runs = {"before": (before, keys, values), "now, float32": (now, keys, values),
        "now, bfloat16": (now, keys.bfloat16(), values.bfloat16())}
print("ms for the 30 layers of one step (keys hot in cache), median of 30 rounds:")
print("| cached | new tokens | " + " | ".join(runs) + " | now / before |")
print("|---|---|" + "---|" * (len(runs) + 1))
for c in (128, 1024):
    for n in (1, 2, 4, 8, 16, 32):
        q = torch.randn(1, 9, n, 64).bfloat16()
        mask = torch.zeros(1, 1, n, c + n)
        times = {name: [] for name in runs}
        for _ in range(30):
            for name, (f, k, v) in runs.items():
                t0 = time.perf_counter()
                for _ in range(10):
                    f(q, k, v, mask, 64, 0.125)
                times[name].append((time.perf_counter() - t0) / 10 * 30 * 1e3)
        ms = {name: statistics.median(t) for name, t in times.items()}
        print(f"| {c} | {n} | " + " | ".join(f"{m:.2f}" for m in ms.values())
              + f" | {ms['now, float32'] / ms['before']:.2f} |")
sys.stdout.flush()
