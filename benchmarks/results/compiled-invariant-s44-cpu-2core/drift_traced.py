"""The invariant compiled step with attention traced into the graph instead of the invariant operator (no
splits anywhere, eager prompts included): does greedy equality with `ar` survive? Same arguments as
benchmarks/greedy_drift.py, always with compile="invariant":

    python benchmarks/results/compiled-invariant-s44-cpu-2core/drift_traced.py bfloat16 60 48 sd:gamma=4 mcsd specinfer
"""

import importlib.util
import json
import sys
from pathlib import Path

from multispec.models import static

static.splits = lambda positions: None  # no split: compiled steps trace attention (`static.attention`)

spec = importlib.util.spec_from_file_location("greedy_drift", Path(__file__).parents[2] / "greedy_drift.py")
drift = importlib.util.module_from_spec(spec)
spec.loader.exec_module(drift)

if __name__ == "__main__":
    rows = next((a.split("=", 1)[1] for a in sys.argv[4:] if a.startswith("--rows=")), None)
    methods = [a for a in sys.argv[4:] if not a.startswith("--")]
    print(json.dumps(drift.main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), methods, "invariant", None, rows)))
