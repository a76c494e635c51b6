"""A bench spread over processes with accelerate: each process runs its share of the prompts and appends its
rows to a shard of its own (`shards/results.<rank>.jsonl`); the main process merges the shards into
`results.jsonl`, in the order a one-process run writes, and makes the summary and the report.

A row's seed depends on its prompt alone (`prompt_seed`), so the rows are those of one process. Prompts go
to processes by position (prompt i to process i mod N), which does not depend on what is already done: a
resumed sweep, with any number of processes, skips every row found in `results.jsonl` or any shard and runs
each missing row once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SHARDS = "shards"


def launched() -> bool:
    """Whether this process is one of several started by `accelerate launch` (or torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def process_state():
    """accelerate's state of this process (rank, count, device, barrier); gloo between CPU processes."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def process_device(state) -> str | None:
    """The device of this process where there are GPUs (one each), else None (the CPU)."""
    return str(state.device) if state.device.type == "cuda" else None


def launch(argv: list[str], processes: int) -> int:
    """Run `multispec <argv>` in `processes` processes through `accelerate launch`; its exit status."""
    import torch

    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        # the multi-process launcher (torchrun), also on a machine without GPUs: each process then
        # finds no CUDA device and joins a gloo group on the CPU
        "--multi_gpu",
    ]
    if torch.cuda.is_available() and torch.cuda.device_count() < processes:
        raise ValueError(
            f"--processes {processes}: this machine has {torch.cuda.device_count()} GPU(s); "
            "give at most one process per GPU"
        )
    return subprocess.call([*command, "-m", "multispec", *argv])


def without_processes(argv: list[str]) -> list[str]:
    """The command line minus its --processes option (the launched processes must not launch again)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--processes":
            skip = True
        elif not a.startswith("--processes="):
            out.append(a)
    return out


def shard_path(out: str | Path, rank: int) -> Path:
    return Path(out) / SHARDS / f"results.{rank}.jsonl"


def shard_files(out: str | Path) -> list[Path]:
    folder = Path(out) / SHARDS
    return sorted(folder.glob("results.*.jsonl")) if folder.is_dir() else []


def remove_shards(out: str | Path) -> None:
    for f in shard_files(out):
        f.unlink()
    folder = Path(out) / SHARDS
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
