"""One-time cost and step time of a compiled shape, three ways, each in a fresh process:
in-memory torch.compile (MULTISPEC_KEEP_COMPILED=0), the first process that compiles a package, and a later
process that loads it. One kernel variant (onednn) is pinned so each compiles once.

    python packages.py target 1 [store-folder]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

STEPS = 30


def measure(which: str, width: int) -> dict:
    import torch

    from multispec.models.default import DRAFT_NAME, TARGET_NAME, load_default

    model = load_default(TARGET_NAME if which == "target" else DRAFT_NAME, compile=True)
    model.kernel = "onednn"
    cache = model.new_cache()
    prompt = model.encode("Tell me about the history of Rome in a few sentences.")
    tokens = torch.tensor([[42] * width])
    with torch.inference_mode():
        model.forward(cache, torch.tensor([prompt]))
        t0 = time.perf_counter()
        model.forward(cache, tokens)
        first = time.perf_counter() - t0
        model.crop(cache, len(prompt))
        times = []
        for _ in range(STEPS + 5):
            start = time.perf_counter()
            model.forward(cache, tokens)
            times.append(time.perf_counter() - start)
            model.crop(cache, len(prompt))
    times = sorted(times[5:])
    return {"model": which, "new_tokens": width, "dtype": str(model.dtype), "first_call_s": round(first, 2),
            "one_time_s": round(model.compile_seconds, 2), "compiles": model.compiles,
            "step_ms_median": round(1e3 * times[len(times) // 2], 2)}


def main() -> None:
    which, width = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3 and sys.argv[3] == "--child":
        print(json.dumps(measure(which, width)))
        return
    store = tempfile.mkdtemp(prefix="packages-")
    rows = []
    for mode, keep in (("in-memory torch.compile", "0"), ("first process: compile a package", "1"),
                       ("later process: load it", "1")):
        env = {**os.environ, "MULTISPEC_COST_FILE": os.path.join(store, "forward_cost.json"),
               "MULTISPEC_KEEP_COMPILED": keep}
        out = subprocess.run([sys.executable, __file__, which, str(width), "--child"], env=env, check=True,
                             capture_output=True, text=True)
        row = {"mode": mode, **json.loads(out.stdout.strip().splitlines()[-1])}
        rows.append(row)
        print(json.dumps(row), flush=True)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(store, "compiled"))
               for f in fs if f.endswith(".pt2"))
    print(json.dumps({"package_mb": round(size / 1e6, 1)}), flush=True)


if __name__ == "__main__":
    main()
