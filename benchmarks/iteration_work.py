"""Where an iteration's time goes besides the model forwards ("other" in `stats`), split by the engine's calls
with plain timers (exclusive times; cProfile's own overhead would swamp calls this small), and the torch
calls an iteration makes outside the forwards.

    python benchmarks/iteration_work.py [--tokens 64] [--out FILE.jsonl]

One prompt, the default pair as loaded (eager unless --compile), each method at T = 0 and 1: a warm-up run,
a run counting torch calls, a timed run (the same seed).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import time

from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

PROMPT = "Explain how a bicycle gear system works, in detail."
METHODS = [
    ("ar", {}),
    ("sd", {"gamma": 1}),
    ("sd", {"gamma": 4}),
    ("sd", {"gamma": "auto", "drafter": "hybrid"}),
    ("mcsd", {"k_config": "2x2x1"}),
    ("mcsd", {"k_config": "8x1"}),
    ("mcsd", {"tree": "auto"}),
    ("specinfer", {}),
    ("mjsd", {}),
    ("mtad", {}),
]


class Timers:
    """Exclusive seconds per wrapped call; forwards are wrapped too so that they are left out of their callers."""

    def __init__(self):
        self.seconds = collections.Counter()
        self.stack: list[float] = []
        self.labels: list[str] = []  # the timed calls in progress, innermost last
        self.in_forward = 0

    def wrap(self, owner, name: str, label: str, forward: bool = False) -> None:
        f = getattr(owner, name, None)
        if f is None:  # an older engine (for a before/after run) may lack it
            return

        @functools.wraps(f)
        def timed(*a, **k):
            t0 = time.perf_counter()
            self.stack.append(0.0)
            self.labels.append(label)
            self.in_forward += forward
            try:
                return f(*a, **k)
            finally:
                self.in_forward -= forward
                self.labels.pop()
                dt = time.perf_counter() - t0
                inner = self.stack.pop()
                self.seconds[label] += dt - inner
                if self.stack:
                    self.stack[-1] += dt

        setattr(owner, name, timed)


class CountCalls(TorchDispatchMode):
    def __init__(self, timers: Timers):
        super().__init__()
        self.timers, self.calls = timers, 0
        self.by_label: collections.Counter[str] = collections.Counter()  # calls by the innermost timed call

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.timers.in_forward:
            self.calls += 1
            self.by_label[self.timers.labels[-1] if self.timers.labels else "loop"] += 1
            return func(*args, **(kwargs or {}))
        with _disable_current_modes():
            return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--methods", default=None, help="only these methods, comma-separated (default: all)")
    args = ap.parse_args()
    import multispec.decoding.joint as joint
    import multispec.decoding.loop as loop
    import multispec.decoding.sd as sd
    import multispec.drafting.beams as beams
    import multispec.drafting.copying as copying
    import multispec.drafting.length as length
    import multispec.drafting.model as dm
    import multispec.drafting.shape as shape
    import multispec.engine as engine
    import multispec.warp as warp
    from multispec.api import generate, load_pair
    from multispec.decoding import tree as tree_method
    from multispec.machine import describe_device

    pair = load_pair(compile=args.compile)
    timers = Timers()
    timers.wrap(type(pair.target), "forward", "forward", forward=True)
    timers.wrap(engine.ModelRunner, "feed", "runner.feed")
    timers.wrap(engine.ModelRunner, "commit", "runner.commit")
    timers.wrap(engine.Session, "commit", "session.commit")
    timers.wrap(dm.DraftChain, "propose", "draft chain propose")
    timers.wrap(dm.DraftTree, "propose", "draft tree propose")
    timers.wrap(dm.ModelDrafter, "accept", "drafter.accept")
    timers.wrap(warp.Sampling, "probs", "Sampling.probs")
    timers.wrap(warp.Sampling, "probs_and_token", "Sampling.probs_and_token")
    timers.wrap(warp.Sampling, "next_token", "Sampling.next_token")
    timers.wrap(sd, "_verify", "sd verify (rule included)")
    timers.wrap(loop, "target_step", "target_step")
    timers.wrap(tree_method, "score_paths", "tree score_paths")
    timers.wrap(beams.BeamDraft, "propose", "beam propose")
    timers.wrap(beams.BeamDraft, "extensions", "beam extensions")
    timers.wrap(beams.BeamDraft, "_pick", "beam pick")
    timers.wrap(beams.Extensions, "at", "beam extensions.at")
    timers.wrap(joint, "joint_verify", "joint_verify")
    timers.wrap(engine.Entries, "tree", "Entries.tree")
    timers.wrap(shape.AutoTree, "propose", "auto-tree propose")
    timers.wrap(shape.AutoTree, "search", "auto-tree search")
    timers.wrap(tree_method, "record_verdict", "record_verdict")
    timers.wrap(tree_method, "greedy_tree_verify", "greedy_tree_verify")
    timers.wrap(tree_method, "tree_verify", "tree_verify")
    timers.wrap(length.AutoLength, "propose", "auto-length propose")
    timers.wrap(length.DraftLength, "plan", "auto-length plan")
    timers.wrap(copying.Hybrid, "options", "hybrid options")
    timers.wrap(copying.CopyDrafter, "find", "copy find")
    timers.wrap(copying.NgramIndex, "update", "ngram update")
    timers.wrap(engine.Session, "draft_depth", "session.draft_depth")
    rows = []
    chosen = None if args.methods is None else set(args.methods.split(","))
    for method, params in (m for m in METHODS if chosen is None or m[0] in chosen):
        for temperature in (0.0, 1.0):
            # a warm-up run, one counting torch calls (the counter slows every call down), one timed
            for rep in ("warm-up", "count", "time"):
                timers.seconds.clear()
                counter = CountCalls(timers)
                with counter if rep == "count" else contextlib.nullcontext():
                    r = generate(
                        pair.target,
                        pair.draft,
                        PROMPT,
                        method=method,
                        max_new_tokens=args.tokens,
                        temperature=temperature,
                        seed=1,
                        score=False,
                        **params,
                    )
                if rep == "count":
                    its = max(1, r.stats["iterations"])
                    calls = counter.calls / its
                    calls_by = {k: round(v / its, 1) for k, v in counter.by_label.most_common()}
                if rep != "time":
                    continue
                st = r.stats
                it = max(1, st["iterations"] or st["target_calls"])
                row = {
                    "method": method,
                    **params,
                    "temperature": temperature,
                    "iterations": it,
                    "target_ms_per_call": 1e3 * st["target_seconds"] / st["target_calls"],
                    "other_ms_per_iteration": 1e3 * st["other_seconds"] / it,
                    "torch_calls_per_iteration": calls,
                    "torch_calls_by_call": calls_by,
                    "split_ms_per_iteration": {
                        k: round(1e3 * v / it, 3) for k, v in timers.seconds.most_common() if k != "forward"
                    },
                    # the rest of "other": the loop and the methods' own code between the calls timed
                    "unattributed_ms_per_iteration": 1e3
                    * (st["other_seconds"] - sum(v for k, v in timers.seconds.items() if k != "forward"))
                    / it,
                    "device": describe_device(pair.target.device),
                    "date": time.strftime("%Y-%m-%d"),
                }
                rows.append(row)
                print(
                    f"{method} {params} T={temperature:g}: other {row['other_ms_per_iteration']:.2f} ms/iteration "
                    f"({row['torch_calls_per_iteration']:.0f} torch calls) against a target call of "
                    f"{row['target_ms_per_call']:.1f} ms; "
                    + ", ".join(f"{k} {v:.2f}" for k, v in list(row["split_ms_per_iteration"].items())[:5])
                    + "; torch calls: "
                    + ", ".join(f"{k} {v:g}" for k, v in calls_by.items()),
                    flush=True,
                )
    if args.out:
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
