"""Does a compiled forward give a token the same logits whatever bucket it is scored in? A 7-token chain scored in
one bucket of 8 against the same tokens scored 1-5 at a time (short context), then one-token and 7-token step
times (medians of 20 and 10). Modes: eager, default (compiled as shipped), freeze (frozen, no autotune), aten
(max-autotune over ATen kernels only), noprepack (frozen, weights not packed). One mode per process:

    python benchmarks/results/compiled-invariant-s25-cpu-2core/bucket_bits.py freeze
"""

import contextlib
import sys
import time

import torch
import torch._dynamo.config as dynamo
import torch._inductor.config as inductor

from multispec import load_pair
from multispec.models import hf

SETTINGS = {"freeze": {"freezing": True}, "noprepack": {"freezing": True, "cpp.weight_prepack": False}}


def patch(mode: str) -> None:
    shipped = hf._compile_settings

    @contextlib.contextmanager
    def settings(cpu):
        if mode == "aten":
            with shipped(cpu), inductor.patch({"max_autotune_gemm_backends": "ATEN"}):
                yield
        else:
            with dynamo.patch(automatic_dynamic_shapes=False, recompile_limit=64, accumulated_recompile_limit=512), \
                    inductor.patch(SETTINGS[mode]):
                yield

    if mode in ("aten", *SETTINGS):
        hf._compile_settings = settings


def median_ms(model, cache, past, tokens, runs):
    times = []
    for _ in range(runs):
        model.crop(cache, past)
        t0 = time.perf_counter()
        model.forward(cache, tokens)
        times.append(time.perf_counter() - t0)
    return round(sorted(times)[runs // 2] * 1000, 1)


def main(mode: str) -> None:
    patch(mode)
    m = load_pair(dtype="bfloat16", compile=mode != "eager").target
    ids = m.encode("Write a short poem about the sea and the wind, please.")
    cache = m.new_cache()
    m.forward(cache, torch.tensor([ids[:-1]]))
    past = cache.length
    chain = torch.tensor([ids[-1:] + [1000, 2000, 3000, 4000, 5000, 6000]])  # 7 tokens: a bucket of 8
    whole = m.forward(cache, chain)[0]
    for width in (1, 2, 3, 4, 5):
        diffs = []
        for start in range(0, 7 - width + 1, width):
            m.crop(cache, past + start)
            diffs.append(float((m.forward(cache, chain[:, start : start + width])[0] - whole[start : start + width])
                               .abs().max()))
        print(mode, "width", width, "max |diff| vs the bucket of 8:", max(diffs), flush=True)
    print(mode, "T(1) ms", median_ms(m, cache, past, chain[:, :1], 20), "T(7) ms", median_ms(m, cache, past, chain, 10))


if __name__ == "__main__":
    main(sys.argv[1])
