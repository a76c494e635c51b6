"""The MLP down-projection (1536 -> 576) of the default target, bfloat16, packed and plain: for each batch size
up to 64, the rows whose output differs from a 1-row call of the same row."""
import torch

from multispec import load_pair
from multispec.models import linears

pair = load_pair(dtype="bfloat16")
hf = pair.target.model
print("pack:", linears.pack(hf))
m = [x for x in hf.modules() if isinstance(x, torch.nn.Linear) and x.in_features == 1536][0]
torch.manual_seed(0)
x = torch.randn(64, 1536).to(torch.bfloat16)
for mode in ("packed", "plain"):
    ctx = linears.active() if mode == "packed" else torch.no_grad()
    with ctx:
        ref = torch.stack([m(x[i:i + 1])[0] for i in range(64)])
        out = {}
        for rows in range(1, 65):
            y = m(x[:rows])
            d = (y != ref[:rows]).any(-1).nonzero().flatten().tolist()
            if d:
                out[rows] = d
    print(mode, "batch sizes with rows differing from 1-row calls (rows listed):", out)
