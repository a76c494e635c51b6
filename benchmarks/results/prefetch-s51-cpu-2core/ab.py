"""The compiled steps of the default pair with this machine's calibrated weight prefetch (`dpbf16.set_prefetch`)
against none, in one process, interleaved: k new tokens after 128 cached, median of 8 rounds. The target runs its
steps as decoding does (batch-invariant where `--compile` chose that), the draft its fast steps."""

import statistics
import time

import torch

from multispec.api import load_model
from multispec.models import cost, dpbf16
from multispec.models.default import DRAFT_NAME, TARGET_NAME

for role, name, invariant in (("target", TARGET_NAME, True), ("draft", DRAFT_NAME, False)):
    model = load_model(name, dtype="bfloat16", compile=True)
    assert dpbf16.unavailable() is None, dpbf16.unavailable()
    calibrated = dpbf16._calibrated_prefetch(dpbf16._digest())
    print(f"{role}: calibrated prefetch {calibrated}", flush=True)
    ids = torch.randint(model.vocab_size, (1, 129), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache()
    model.forward(cache, ids[:, :128], logits_to_keep=1, batch_invariant=invariant)
    past = cache.length
    for k in (1, 2, 3, 4, 8, 16, 17, 32):
        tokens = torch.randint(model.vocab_size, (1, k), generator=torch.Generator().manual_seed(k))
        times = {"none": [], "calibrated": []}
        for repeat in range(9):
            for setting, modes in (("none", {1: "none"}), ("calibrated", calibrated)):
                dpbf16.set_prefetch(modes)
                start = time.perf_counter()
                model.forward(cache, tokens, batch_invariant=invariant)
                elapsed = time.perf_counter() - start
                cache.crop(past)
                if repeat:
                    times[setting].append(elapsed)
        none, calibrated_ms = (1e3 * statistics.median(times[s]) for s in ("none", "calibrated"))
        print(f"{role} k={k:2d}: none {none:6.2f} ms  calibrated {calibrated_ms:6.2f} ms  ratio "
              f"{calibrated_ms / none:.3f}", flush=True)
    dpbf16.set_prefetch(calibrated)
    del model
entry = {k: v for k, v in cost.read_store(cost._store_path().with_name("compiled_kernels.json")).items()
         if k.startswith("dpbf16 prefetch")}
print("stored calibration:", entry)
