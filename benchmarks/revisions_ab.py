"""One method's speed at two git revisions of this repository, interleaved prompt by prompt.

Each revision's `multispec` package is exported (`git archive`) to a temporary folder and runs in its own
worker process on the default pair; the two workers take turns on every prompt, so machine noise hits
both alike. Greedy decoding: both revisions must give the same tokens (checked). The figure to read is
the median of the per-prompt ratios after / before.

    python benchmarks/revisions_ab.py --before d9fe735 --after HEAD --method sd --limit 10

`--compile` runs both on compiled steps (`load_pair(compile=True)`): where the two revisions key and build their
packages alike, both load the same packages from this machine's cache, and the figure is the code around them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, sys, torch
import multispec
from multispec.api import generate, load_pair
torch.set_num_threads(int(sys.argv[1]))
pair = load_pair(compile=json.loads(sys.argv[2]))
print(json.dumps({"ready": multispec.__file__}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    r = generate(pair.target, pair.draft, job["prompt"], method=job["method"], max_new_tokens=job["tokens"],
                 temperature=0.0, seed=0, score=False, **job["params"])
    print(json.dumps({"tokens": r.token_ids, "seconds": r.stats["seconds"]}), flush=True)
"""


def export(revision: str, into: Path) -> Path:
    """The package as committed at `revision`, unpacked under `into`."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision, "multispec"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def start(path: Path, threads: int, compile: bool) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(threads), json.dumps(compile)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=path,
    )
    ready = json.loads(proc.stdout.readline())["ready"]
    if not ready.startswith(str(path)):  # an installed copy would shadow the exported one
        raise RuntimeError(f"the worker for {path} imported multispec from {ready}")
    return proc


def ask(proc: subprocess.Popen, job: dict) -> dict:
    proc.stdin.write(json.dumps(job) + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--method", default="sd")
    ap.add_argument("--param", action="append", default=[], help="key=value, passed to generate")
    ap.add_argument("--prompts", default="mt-bench")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="both revisions on compiled steps")
    args = ap.parse_args()
    from multispec.tools.bench.prompts import load_prompts

    params = dict(p.split("=", 1) for p in args.param)
    prompts = load_prompts([args.prompts], limit=args.limit, spread=True)
    with tempfile.TemporaryDirectory() as tmp:
        workers = {
            name: start(export(rev, Path(tmp) / name), args.threads, args.compile)
            for name, rev in (("before", args.before), ("after", args.after))
        }
        ratios, speeds = [], {"before": [], "after": []}
        for prompt in prompts:
            job = {"prompt": prompt.text, "method": args.method, "tokens": args.max_new_tokens, "params": params}
            out = {name: ask(proc, job) for name, proc in workers.items()}
            if out["before"]["tokens"] != out["after"]["tokens"]:
                raise SystemExit(f"{prompt.id}: the two revisions gave different tokens")
            n = len(out["after"]["tokens"])
            for name in speeds:
                speeds[name].append(n / out[name]["seconds"])
            ratios.append(speeds["after"][-1] / speeds["before"][-1])
            print(
                f"{prompt.id:24s} {n:4d} tokens  before {speeds['before'][-1]:6.1f} tok/s  "
                f"after {speeds['after'][-1]:6.1f} tok/s  after/before {ratios[-1]:.3f}",
                flush=True,
            )
        for proc in workers.values():
            proc.stdin.close()
            proc.wait()
    q1, med, q3 = np.percentile(ratios, [25, 50, 75])
    print(
        f"{args.method} {params or ''}: before {np.median(speeds['before']):.1f} tok/s, after "
        f"{np.median(speeds['after']):.1f} tok/s (medians); after/before median {med:.3f} ({q1:.3f}-{q3:.3f}) "
        f"over {len(ratios)} prompts"
    )


if __name__ == "__main__":
    main()
