"""What W draft beams cost per iteration, two ways: the beams grown as a tree of W nodes per depth
in ONE draft cache row (`BeamDraft`, what `mtad` / `mjsd` use), against W cache rows reordered as
beams are chosen (the authors' code's layout: the prompt's cache copied into W rows, `index_select` on
every reorder, one row kept at commit).

Both run deterministic beam decoding (so they must pick the same block; checked) for `gamma` steps on the
default draft at two context lengths, and each iteration ends as a fully accepted block does: the chosen
path is kept in the draft cache and a next token is appended. Iterations of the two variants interleave so
machine noise hits them alike; the figure is the median per-iteration time. Usage:
    python benchmarks/beam_draft_cost.py [--width 8] [--gamma 4] [--rounds 12] [--out FILE.json]
"""

import argparse
import json
import time

import numpy as np
import torch

import multispec
from multispec.drafting import BeamDraft, setup_of
from multispec.engine import Session
from multispec.verify import Verdict
from multispec.warp import Sampling


def tree_iteration(s: Session, proposer: BeamDraft, gamma: int) -> list[int]:
    p = proposer.propose(s.tokens, (1,) * gamma)
    block = p.tokens.tolist()
    verdict = Verdict(tuple(range(gamma)), tuple(block), 7)
    s.commit(verdict, drafted=gamma)
    proposer.accept(verdict)
    return block


def rows_iteration(s: Session, width: int, gamma: int) -> list[int]:
    runner, model = s.draft_runner(), s.draft_model
    logits = runner.feed([s.tokens])[0, -1:]  # [1, V]: the root, on one cache row
    base = runner.committed
    paths, scores, rows = [[]], torch.zeros(1, dtype=torch.float64), None
    for depth in range(1, gamma + 1):
        joint = scores[:, None] + torch.log_softmax(logits.double(), -1)  # [B, V]
        top = torch.topk(joint.reshape(-1), width)
        rows, tokens = top.indices // joint.shape[1], top.indices % joint.shape[1]
        paths = [paths[b] + [t] for b, t in zip(rows.tolist(), tokens.tolist(), strict=True)]
        scores = top.values
        if depth < gamma:  # each cache row follows its beam: copy the parents' rows, feed one token per row
            model.select_rows(runner.cache, rows)
            positions = torch.full((width, 1), base + depth - 1)
            logits = model.forward(runner.cache, tokens[:, None], positions)[:, -1]
    best = int(scores.argmax())
    block = paths[best]
    # commit the fully accepted block: keep the best beam's row (it holds the block but its last token)
    model.select_rows(runner.cache, rows[best : best + 1])
    model.crop(runner.cache, base + gamma - 1)
    runner.committed, runner.tentative = base + gamma - 1, 0
    s.append(block + [7])
    return block


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    pair = multispec.load_pair()
    text = "Write a short story about a lighthouse keeper and the storm that changed her mind. "
    results = {}
    for repeat in (7, 40, 85):
        prompt = pair.target.encode(text * repeat)
        sessions = {
            k: Session(pair.target, pair.draft, prompt, Sampling(1.0), 10_000, torch.Generator())
            for k in ("tree", "rows")
        }
        s = sessions["tree"]
        proposer = BeamDraft(s.draft_runner(), setup_of(s), args.width, deterministic=True)
        times = {k: [] for k in sessions}
        for r in range(args.rounds + 1):
            t0 = time.perf_counter()
            a = tree_iteration(sessions["tree"], proposer, args.gamma)
            t1 = time.perf_counter()
            b = rows_iteration(sessions["rows"], args.width, args.gamma)
            t2 = time.perf_counter()
            if a != b:
                raise AssertionError(f"the two layouts chose different blocks: {a} vs {b}")
            if r:  # round 0 holds the prefill
                times["tree"].append(t1 - t0)
                times["rows"].append(t2 - t1)
        med = {k: 1000 * float(np.median(v)) for k, v in times.items()}
        results[len(prompt)] = {"ms_per_iteration": med, "rows_over_tree": med["rows"] / med["tree"]}
        print(
            f"context {len(prompt)} tokens, W={args.width}, gamma={args.gamma}: tree in one row "
            f"{med['tree']:.1f} ms, W cache rows {med['rows']:.1f} ms per iteration "
            f"(rows / tree {med['rows'] / med['tree']:.2f})"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"width": args.width, "gamma": args.gamma, "rounds": args.rounds, "results": results}, f, indent=1
            )


if __name__ == "__main__":
    main()
