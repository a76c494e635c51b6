"""Reduced draft vocabularies: a draft that scores only the N tokens its target writes most often.

Most of a small draft's step is its output head: the shipped draft's head holds 49,152 rows of 198 against 4.9 M
parameters in its layers. Keeping only the head rows of the N most frequent tokens (FR-Spec, Zhao et al. 2025)
cuts that work by V / N, with no retraining. Tokens outside the kept set get draft probability 0 (logit -inf):
every verification rule stays exact whatever the draft's support (a rejected position's residual,
max(0, target - draft), holds the target's whole mass outside the kept set), so only acceptance can change.

`ReducedVocab` is that draft behind the ordinary interface: its forward returns logits over the whole vocabulary,
-inf outside the kept ids. For a transformers model the head itself is cut (`HFModel.with_head_rows`); any other
backend is scored whole and masked (the same law, without the saving).

Which tokens: counts of the target's own answers to the draft-training prompt pool, kept beside a draft as
`token_counts.safetensors` (`multispec distill` writes them; the shipped draft carries them). A draft without them
falls back to counting the packaged self-instruct seed tasks (instructions, inputs and answers) with its
tokenizer, which covers fewer of a chat model's tokens.
"""

from __future__ import annotations

import json
import weakref
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from .base import LanguageModel

COUNTS_FILE = "token_counts.safetensors"


def save_token_counts(folder: Path, counts: torch.Tensor, source: str) -> Path:
    """Write `counts` ([V] integers: how often each token id was seen) as `folder/token_counts.safetensors`."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / COUNTS_FILE
    if int(counts.max()) >= 2**31:
        raise ValueError("token counts above 2**31 do not fit the file's int32")
    save_file({"counts": counts.to(torch.int32).contiguous()}, str(path), metadata={"source": source})
    return path


def read_token_counts(folder: Path | str) -> torch.Tensor | None:
    """The counts kept in `folder` (`save_token_counts`), or None where it holds none."""
    path = Path(folder) / COUNTS_FILE
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    return load_file(str(path))["counts"].long()


def seed_task_counts(model: LanguageModel) -> torch.Tensor:
    """Token counts of the packaged self-instruct seed tasks (instructions, inputs and outputs), by `model`'s
    tokenizer: the fallback for a draft that carries no counts of its target's answers."""
    if model.tokenizer is None:
        raise ValueError(
            f"draft_vocab: {model.name} has neither token counts nor a tokenizer to count with; give the kept ids"
        )
    text = resources.files("multispec.data").joinpath("self_instruct_seed_tasks.jsonl").read_text(encoding="utf-8")
    counts = torch.zeros(model.vocab_size, dtype=torch.int64)
    for line in text.splitlines():
        if not line.strip():
            continue
        task = json.loads(line)
        parts = [task.get("instruction", "")]
        for instance in task.get("instances", []):
            parts += [instance.get("input", ""), instance.get("output", "")]
        ids = torch.tensor(model.encode("\n".join(p for p in parts if p), chat=False), dtype=torch.long)
        ids = ids[ids < model.vocab_size]
        counts += torch.bincount(ids, minlength=model.vocab_size)
    return counts


def top_ids(counts: torch.Tensor, n: int, always: frozenset[int] | set[int] = frozenset()) -> torch.Tensor:
    """The n ids to keep: `always` (a model's stop tokens, so that a draft can still end a text), then the most
    counted, ties to the lower id. Returns them sorted, [n] int64."""
    vocab = counts.numel()
    if not 1 <= n <= vocab:
        raise ValueError(f"draft_vocab must be in [1, {vocab}] (the vocabulary's size), got {n}")
    always = sorted(i for i in always if 0 <= i < vocab)[:n]
    score = counts.to(torch.float64).clone()
    score[always] = float("inf")
    order = torch.sort(-score, stable=True).indices  # stable: equal counts keep id order
    return torch.sort(order[:n]).values


def token_counts(model: LanguageModel) -> torch.Tensor:
    """The counts that rank `model`'s tokens: its own (`model.token_counts`, read at load), else the seed tasks'."""
    counts = getattr(model, "token_counts", None)
    if counts is not None and counts.numel() == model.vocab_size:
        return counts
    return seed_task_counts(model)


_REDUCED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {n: its ReducedVocab}


def reduce_vocab(model: LanguageModel, n: int, ids: torch.Tensor | None = None) -> ReducedVocab:
    """`model` drafting from n tokens: `ids` [n], else the n most frequent (`token_counts`) and its stop tokens
    (made once per model and n). A transformers model gets a head of those rows only; another backend (or a batch's
    row stand-in, whose forwards the batch runs) is scored whole and masked."""
    made = _REDUCED.setdefault(model, {}) if ids is None else {}
    if n in made:
        return made[n]
    ranked = ids is None  # the n most frequent: a background worker can cut the same head again
    if ranked:
        ids = top_ids(token_counts(model), n, model.stop_tokens)
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ids.numel() != n or ids.unique().numel() != n or int(ids.min()) < 0 or int(ids.max()) >= model.vocab_size:
        raise ValueError(f"draft_vocab: {n} distinct token ids below {model.vocab_size} are needed")
    # the class's method: a stand-in's attribute lookups reach its model; None where the head cannot be cut
    cut = getattr(type(model), "with_head_rows", None)
    made[n] = ReducedVocab(model, ids, cut(model, ids, n if ranked else None) if cut is not None else None)
    return made[n]


class ReducedVocab(LanguageModel):
    """`model` with draft probability 0 outside `ids`. `head`: the same model whose logits are those ids' only
    (`HFModel.with_head_rows`), sharing its weights; None: `model`'s whole logits are cut to them."""

    def __init__(self, model: LanguageModel, ids: torch.Tensor, head: LanguageModel | None = None):
        self.full, self.ids = model, ids.to(model.device)
        self.scorer = head if head is not None else model
        self.cut = head is not None
        self.vocab_size = model.vocab_size
        self.max_length = model.max_length
        self.eos_token_id = model.eos_token_id
        self.stop_token_ids = model.stop_token_ids
        self.tokenizer = model.tokenizer
        self.device = model.device
        # a name of its own: its cost curves (cheaper steps) are measured and kept apart from the whole model's
        self.name = f"{model.name}[vocab={ids.numel()}]"

    def __getattr__(self, attr: str) -> Any:
        # what the engine reads of a backend beyond the interface (dtype, compile, padded_tokens, forward_rows...)
        if attr in ("full", "scorer", "ids", "cut"):
            raise AttributeError(attr)
        return getattr(self.scorer, attr)

    def widen(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over the kept ids ([..., n], or whole [..., V] when not cut) -> [..., V], -inf elsewhere."""
        kept = logits if self.cut else logits.index_select(-1, self.ids)
        out = torch.full((*kept.shape[:-1], self.vocab_size), float("-inf"), dtype=kept.dtype, device=kept.device)
        return out.index_copy_(-1, self.ids, kept)

    def new_cache(self) -> Any:
        return self.scorer.new_cache()

    def prepare(self) -> None:
        self.scorer.prepare()

    def forward(
        self, cache, tokens, positions=None, mask=None, logits_to_keep=0, fused_prefix=0, batch_invariant=True
    ) -> torch.Tensor:
        return self.widen(
            self.scorer.forward(cache, tokens, positions, mask, logits_to_keep, fused_prefix, batch_invariant)
        )

    def forward_rows(self, cache, feeds: list[tuple]) -> list[torch.Tensor]:
        return [self.widen(x) for x in self.scorer.forward_rows(cache, feeds)]

    def crop(self, cache, length: int) -> None:
        self.scorer.crop(cache, length)

    def select_rows(self, cache, rows: torch.Tensor) -> None:
        self.scorer.select_rows(cache, rows)

    def keep_positions(self, cache, positions: torch.Tensor) -> None:
        self.scorer.keep_positions(cache, positions)

    def encode(self, text: str, chat: bool = True) -> list[int]:
        return self.full.encode(text, chat)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.full.encode_chat(messages)

    def decode(self, ids: list[int]) -> str | None:
        return self.full.decode(ids)
