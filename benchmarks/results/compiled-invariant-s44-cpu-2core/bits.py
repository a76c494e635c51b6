"""Which compiled step gives a token the same logits whatever bucket it is scored in? The default target cut to
LAYERS layers (quick compiles), bfloat16, compiled in memory in one inductor variant (MODE); a 7-token chain is
scored in one bucket of 8, then the same tokens 1, 2 and 4 at a time, and every token's logits are compared bit
for bit. One mode per process:

    python benchmarks/results/compiled-invariant-s44-cpu-2core/bits.py cpp-opaque [LAYERS]
"""

import os
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from multispec.models import hf, static
from multispec.models.default import converted_checkpoint

MODES = {
    "onednn": {"freezing": True},
    "autotuned": {"freezing": True, "max_autotune": True, "max_autotune_report_choices_stats": False},
    "cpp": {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP",
            "max_autotune_report_choices_stats": False},
    "aten": {},
}
OPAQUE = "-opaque"
PAD2 = "-pad2"  # a mode's suffix: one new token is scored in the bucket of 2 (two rows for every product)  # a mode's suffix: attention as the opaque batch-invariant operator, not traced


def main(mode: str, layers: int) -> None:
    # the library's own steps: packaged (shipped), compile="invariant", or eager
    library = mode in ("shipped", hf.INVARIANT, "eager")
    if not library:
        os.environ["MULTISPEC_KEEP_COMPILED"] = "0"
        static.TRACED_ATTENTION = OPAQUE not in mode
        hf.KERNELS[mode] = MODES[mode.removesuffix(PAD2).removesuffix(OPAQUE)]
    path = converted_checkpoint()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    model_layers = len(model.model.layers)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    # the default target's own name when whole: its packaged steps (mode shipped) are found under it
    name = "smollm2-135m-instruct" if layers == model_layers else f"target-{layers}"
    m = hf.HFModel(model, AutoTokenizer.from_pretrained(path), name=name,
                   compile=hf.INVARIANT if mode == hf.INVARIANT else mode != "eager")
    if not library:
        m.kernel = mode
    if mode.endswith(PAD2):
        m.bucket_route = {1: 2}
    ids = m.encode("Write a short poem about the sea and the wind, please.")
    chain = torch.tensor([ids[-1:] + [1000, 2000, 3000, 4000, 5000, 6000]])
    cache = m.new_cache()
    m.forward(cache, torch.tensor([ids[:-1]]))
    past = cache.length
    whole = m.forward(cache, chain)[0]
    for width in (1, 2, 4):
        rows = []
        for start in range(0, 7, width):
            m.crop(cache, past + start)
            part = chain[:, start : start + width]
            rows.append(m.forward(cache, part)[0])
        each = torch.cat(rows)
        same = [bool(torch.equal(each[i], whole[i])) for i in range(7)]
        print(mode, layers, "width", width, "equal to the bucket of 8:", "".join("=" if s else "x" for s in same),
              "max |diff|", float((each - whole).abs().max()), flush=True)
    times = {}
    for width in (1, 2, 4, 8):
        runs = []
        for _ in range(20):
            m.crop(cache, past)
            t0 = time.perf_counter()
            m.forward(cache, chain[:, :width] if width < 8 else torch.cat([chain, chain[:, :1]], 1))
            runs.append(time.perf_counter() - t0)
        times[width] = round(1e3 * statistics.median(runs), 1)
    print(mode, layers, "step ms by new tokens (median of 20):", times, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
