"""greedy_drift with every target step of up to 8 tokens in one compiled bucket of 8 (an experiment).

    python benchmarks/results/compiled-invariant-s25-cpu-2core/one_bucket.py > drift-bf16-compiled-one-bucket.json
"""

import importlib.util
import json
from pathlib import Path

from multispec.models import hf

spec = importlib.util.spec_from_file_location("greedy_drift", Path(__file__).parents[2] / "greedy_drift.py")
greedy_drift = importlib.util.module_from_spec(spec)
spec.loader.exec_module(greedy_drift)

if __name__ == "__main__":
    hf._bucket = lambda n: 8 if n <= 8 else 1 << max(0, n - 1).bit_length()
    print(json.dumps(greedy_drift.main("bfloat16", 20, 48, ["sd:gamma=4"], True)))
