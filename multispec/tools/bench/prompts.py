"""Prompt sets for the harness, in three formats, kept in file order so that runs are comparable.

- Spec-Bench JSONL: one object a line with `question_id`, `category`, `turns` (the first turn is the
  prompt; later turns need the model's earlier answers and are not used), optional `reference` (a
  string, or a list with one entry per turn).
- A JSON list of strings (such as wmt_ende.json): category = the file's stem, no references.
- Plain JSONL: one object a line with `prompt` (text, or a list of token ids), optional `id`,
  `category` and `reference`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...data import prompt_file


@dataclass(frozen=True)
class Prompt:
    id: str  # unique across files: "<file stem>:<id in the file>"
    category: str
    text: str | list[int]  # a list of token ids is fed as is (models without a tokenizer)
    reference: str | None = None


def load_prompt_file(path: str | Path, categories: list[str] | None = None, limit: int | None = None) -> list[Prompt]:
    """The prompts of one file (a path, or a shipped set's name such as `mt-bench`) in file order, those of
    `categories` only (if given), then the first `limit`."""
    path = prompt_file(path)
    if path.is_dir():
        raise ValueError(f"prompt file {path} is a folder")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"prompt file {path} is not UTF-8 text") from None
    if not text.strip():
        raise ValueError(f"prompt file {path} is empty")
    prompts = _json_list(path, text) if text.lstrip().startswith("[") else _jsonl(path, text)
    if categories:
        prompts = [p for p in prompts if p.category in categories]
    return prompts[:limit] if limit is not None else prompts


def load_prompts(
    paths: list[str | Path], categories: list[str] | None = None, limit: int | None = None, spread: bool = False
) -> list[Prompt]:
    """Several files, one after the other; `categories` filters all of them and `limit` applies to each
    file (so MT-Bench + WMT with limit 10 gives 10 of each); `spread`: see `select_prompts`."""
    if not paths:
        raise ValueError("no prompt file given")
    return select_prompts([load_prompt_file(p) for p in paths], categories, limit, spread)


def _round_robin(prompts: list[Prompt]) -> list[Prompt]:
    """The first prompt of each category (in order of first appearance), then the second of each, ..."""
    by_category: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    lists = list(by_category.values())
    return [lst[i] for i in range(max(map(len, lists), default=0)) for lst in lists if i < len(lst)]


def select_prompts(
    groups: list[list[Prompt]], categories: list[str] | None = None, limit: int | None = None, spread: bool = False
) -> list[Prompt]:
    """`categories` filters every group, then `limit` applies to each group; ids must be unique.
    With `spread`, a group's prompts are taken from its categories in turn (round robin, file order within
    a category), so a limit covers every category of a file whose categories come in blocks (MT-Bench)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
    if categories:
        known = sorted({p.category for file in groups for p in file})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise ValueError(f"unknown category {unknown[0]!r}; the prompt files have: {', '.join(known)}")
    out: list[Prompt] = []
    for file in groups:
        chosen = [p for p in file if not categories or p.category in categories]
        if spread:
            chosen = _round_robin(chosen)
        out.extend(chosen[:limit] if limit is not None else chosen)
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"prompt id {dup!r} occurs twice (the same file given twice, or repeated ids in one file)")
    return out


def _json_list(path: Path, text: str) -> list[Prompt]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"prompt file {path} is not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(items, list) or not all(isinstance(s, str) and s.strip() for s in items):
        raise ValueError(f"prompt file {path}: a .json prompt file must be a list of non-empty strings")
    return [Prompt(f"{path.stem}:{i}", path.stem, s) for i, s in enumerate(items)]


def _jsonl(path: Path, text: str) -> list[Prompt]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"prompt file {path} line {n} is not valid JSON ({e.msg}); expected one object "
                "a line (Spec-Bench `turns` or plain `prompt`), or a JSON list of strings"
            ) from None
        if not isinstance(row, dict):
            raise ValueError(f"prompt file {path} line {n} is not a JSON object")
        where = f"prompt file {path} line {n}"
        if "turns" in row:
            turns = row["turns"]
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
                raise ValueError(f"{where}: 'turns' must be a list whose first entry is a non-empty string")
            prompt, key = turns[0], row.get("question_id", len(out))
        elif "prompt" in row:
            prompt, key = row["prompt"], row.get("id", row.get("question_id", len(out)))
            ok_text = isinstance(prompt, str) and prompt.strip()
            ok_ids = (
                isinstance(prompt, list)
                and prompt
                and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            )
            if not (ok_text or ok_ids):
                raise ValueError(f"{where}: 'prompt' must be a non-empty string or a list of token ids")
        else:
            raise ValueError(f"{where} has neither 'turns' (Spec-Bench) nor 'prompt'")
        reference = row.get("reference")
        if isinstance(reference, list):  # Spec-Bench: one reference per turn; we use the first turn
            reference = reference[0] if reference else None
        if isinstance(reference, list) and all(isinstance(r, str) for r in reference):
            # Spec-Bench's RAG rows list several acceptable answers for a turn: the first is the reference
            reference = reference[0] if reference else None
        if reference is not None and not isinstance(reference, str):
            raise ValueError(f"{where}: 'reference' must be a string or a list of strings")
        category = row.get("category", path.stem)
        out.append(Prompt(f"{path.stem}:{key}", str(category), prompt, reference or None))
    if not out:
        raise ValueError(f"prompt file {path} holds no prompts")
    return out
