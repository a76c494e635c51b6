"""What a batched step costs packed against padded, and what a prompt's chunk beside decoding rows costs.

`HFModel.forward_rows` packs the rows' new tokens end to end (the linear maps compute the tokens fed); a padded
step would feed every row as many tokens as the widest. Both are timed here on the default target, eagerly, in
one process, rounds interleaved, each row holding `--context` entries; the padded step is the packed one with
every row's feed widened to the widest (the same products a padded layout computes). Shapes:

- `decode`: 8 rows of one token;
- `chains`: 8 rows drafting chains of different lengths (widths 1, 1, 1, 2, 2, 3, 4, 5);
- `chunk`: 7 rows of one token beside a 64-token prompt chunk in an empty row; against it, `apart`: the chunk's
  forward alone (`HFModel.forward`, as a prompt ran before chunked prefill) plus the 7 rows' step.

Prints one JSON object: median seconds per shape and layout, and the ratios padded / packed and apart / chunk.

    python benchmarks/packed_step.py [--rounds 7] [--context 200] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import multispec
from multispec.models.static import RowKV

CHAINS = (1, 1, 1, 2, 2, 3, 4, 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--out")
    args = parser.parse_args()
    target = multispec.load_pair(compile=False).target
    rows, context = 8, args.context
    cache = target.new_batch_cache(rows, context + 256)
    views = [RowKV(cache, row) for row in range(rows)]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(target.vocab_size, (rows, context + 64), generator=gen)
    for row, view in enumerate(views):
        view.capacity = context + 128
        target.forward(view, ids[row : row + 1, :context], logits_to_keep=1)

    def step(widths: dict[int, int], empty: int | None = None) -> float:
        feeds = [(row, views[row], ids[row, context : context + w], None, None, 1) for row, w in widths.items()]
        if empty is not None:  # a prompt's first chunk, in a row that holds nothing yet
            views[empty].length = 0
            feeds.append((empty, views[empty], ids[empty, :64], None, None, 1, 63))
        start = time.perf_counter()
        target.forward_rows(cache, feeds)
        seconds = time.perf_counter() - start
        for row in widths:
            views[row].length = context
        return seconds

    def apart() -> float:
        views[7].length = 0
        start = time.perf_counter()
        target.forward(views[7], ids[7:8, :64], logits_to_keep=1, fused_prefix=63)
        seconds = time.perf_counter() - start
        return seconds + step(dict.fromkeys(range(7), 1))

    shapes = {
        "decode packed": lambda: step(dict.fromkeys(range(rows), 1)),
        "chains packed": lambda: step(dict(enumerate(CHAINS))),
        "chains padded": lambda: step(dict.fromkeys(range(rows), max(CHAINS))),
        "chunk packed": lambda: step(dict.fromkeys(range(7), 1), empty=7),
        "chunk padded": lambda: step(dict.fromkeys(range(8), 64)),
        "chunk apart": apart,
    }
    for measure in shapes.values():  # warm-up
        measure()
    times: dict[str, list[float]] = {name: [] for name in shapes}
    for _ in range(args.rounds):
        for name, measure in shapes.items():
            times[name].append(measure())
    median = {name: statistics.median(t) for name, t in times.items()}
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "threads": torch.get_num_threads(),
        "dtype": str(target.dtype),
        "context": context,
        "rounds": args.rounds,
        "seconds": median,
        "chains padded / packed": median["chains padded"] / median["chains packed"],
        "chunk padded / packed": median["chunk padded"] / median["chunk packed"],
        "chunk apart / packed": median["chunk apart"] / median["chunk packed"],
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
