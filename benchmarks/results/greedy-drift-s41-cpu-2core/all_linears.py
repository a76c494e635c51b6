"""Every linear shape of the default target, bfloat16, packed: rows of 1-32-row products that differ from 1-row calls."""
import torch

from multispec import load_pair
from multispec.models import linears

pair = load_pair(dtype="bfloat16")
hf = pair.target.model
print("pack:", linears.pack(hf))
mods = [m for m in hf.modules() if isinstance(m, torch.nn.Linear)]
print(len(mods), "linears; packed:", sum(linears.packed_weight(m) is not None for m in mods))
torch.manual_seed(0)
shapes = {}
for m in mods:
    shapes.setdefault((m.in_features, m.out_features), m)
for (i, o), m in shapes.items():
    name = f"{i}->{o}"
    x = torch.randn(32, m.in_features).to(torch.bfloat16)
    with linears.active():
        ref = torch.stack([m(x[i:i + 1])[0] for i in range(32)])
        bad = {}
        for rows in (1, 2, 3, 4, 8, 16, 29, 32):
            out = m(x[:rows])
            bad[rows] = int((out != ref[:rows]).any(-1).sum())
    print(name, m.in_features, m.out_features, "rows differing from 1-row calls, by batch size:", bad)
