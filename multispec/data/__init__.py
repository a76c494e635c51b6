"""The prompt sets this project evaluates on, shipped with the package (see README.md in this folder).

`data_dir()` is the one place that says where they are: `$MULTISPEC_DATA` when set (a folder holding
files of the same names), else this package folder. `prompt_file(name_or_path)` takes a set's name
(`mt-bench`, `spec-bench-dev`, `wmt-ende`, `self-instruct-seeds`) or a path.
"""

from __future__ import annotations

import os
from pathlib import Path

PROMPT_SETS = {
    "mt-bench": "mt_bench.jsonl",
    "spec-bench-dev": "spec_bench_dev.jsonl",
    "wmt-ende": "wmt_ende.json",
    "self-instruct-seeds": "self_instruct_seed_tasks.jsonl",
}


def data_dir() -> Path:
    env = os.environ.get("MULTISPEC_DATA")
    return Path(env) if env else Path(__file__).resolve().parent


def prompt_file(name_or_path: str | Path) -> Path:
    """A prompt set's file by name, or the given path; a clear error when it is missing."""
    text = str(name_or_path)
    if text in PROMPT_SETS:
        path = data_dir() / PROMPT_SETS[text]
        if not path.exists():
            raise ValueError(f"prompt set {text!r} is not in {data_dir()} (MULTISPEC_DATA points elsewhere?)")
        return path
    path = Path(text).expanduser()
    if not path.exists():
        raise ValueError(f"prompt file {text} does not exist (prompt sets by name: {', '.join(PROMPT_SETS)})")
    return path
