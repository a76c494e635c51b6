"""Every linear shape of the default target in bfloat16, packed and plain, 3 random 64-row inputs: for each
product size n (1..64), the rows of x[:n] whose output differs from a 1-row call (vs1) and from 2-row products
(vs2). Lists the first sizes that differ and the rows differing at n = 64."""

import time

import torch

from multispec import load_pair
from multispec.models import linears

pair = load_pair(dtype="bfloat16")
m = pair.target
print("packed", m.eager_packed(), "min_rows", m.min_rows)
mods = {}
for x in m.model.modules():
    if type(x) is torch.nn.Linear:
        mods.setdefault((x.in_features, x.out_features), x)
for mode in ("packed", "plain"):
    ctx = linears.active() if mode == "packed" else torch.no_grad()
    with torch.inference_mode(), ctx:
        for shape, mod in mods.items():
            t0 = time.perf_counter()
            for seed in range(3):
                x = torch.randn(64, shape[0], generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
                one = torch.cat([mod(x[r : r + 1]) for r in range(64)])
                two = torch.cat([mod(x[r : r + 2]) for r in range(0, 64, 2)])
                bad1 = {n: (mod(x[:n]) != one[:n]).any(-1).nonzero().flatten().tolist() for n in range(1, 65)}
                bad1 = {n: v for n, v in bad1.items() if v}
                bad2 = {
                    n: v for n in range(2, 65) if (v := (mod(x[:n]) != two[:n]).any(-1).nonzero().flatten().tolist())
                }
                print(mode, shape, seed, "vs1:", sorted(bad1)[:3], bad1.get(64), "vs2:", sorted(bad2)[:3], bad2.get(64))
            print(f"{time.perf_counter() - t0:.2f}s")
