"""Training data: the target answers the prompt pool, and its next-token distributions are kept.

The target writes its answers with multispec's own batched engine (`multispec.generate_batch`, `ar`: one cache
row per prompt, the fast steps of this machine), then scores them in one forward pass per batch for the
distributions. Each distribution is kept as its top-K log-probabilities plus the tail mass (the rest): the KL
to this (K + 1)-bucket coarsening is what training minimises, and K = 64 holds most of the mass.

On-policy data (`build_on_policy`): the draft being trained writes the answers instead, and the target
scores them the same way; the rows have the same form. Training on the draft's own continuations teaches it
where it actually goes wrong during decoding, which the target's answers alone never visit (DistillSpec, Zhou
et al. 2023).

Shards are written one batch at a time (atomically), so an interrupted run keeps every finished batch
and a rerun continues after the last one.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

TOP_K = 64


def shard_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:05d}.pt"


def existing_shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("shard-*.pt"))


def _left_padded(ids: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, width - len(x) :] = torch.tensor(x)
        mask[i, width - len(x) :] = 1
    return input_ids, mask


def _row(prompt_ids: list[int], answer: list[int], logits: torch.Tensor, greedy: bool, **extra) -> dict:
    """One training row: the answer and the target's top-K log-probabilities at each of its positions."""
    top = torch.log_softmax(logits.float(), -1).topk(TOP_K, -1)
    return {
        "prompt_ids": torch.tensor(prompt_ids, dtype=torch.int32),
        "ids": torch.tensor(answer, dtype=torch.int32),
        "top_idx": top.indices.to(torch.int32),
        "top_logp": top.values.to(torch.float16),
        "greedy": greedy,
        **extra,
    }


def _answer_length(gen: list[int], eos: int) -> int:
    return gen.index(eos) + 1 if eos in gen else len(gen)


@torch.inference_mode()
def answer_batch(target, prompts: list[str], max_new_tokens: int, greedy: bool, seed: int) -> list[dict]:
    """One batch of target answers with their top-K teacher distributions: written by the batched engine
    (prompt i seeded `seed + i`; greedy, or sampled at temperature 1 with nothing cut from the law), then
    scored (`score_answers`). Answers shorter than two tokens are dropped."""
    from ...batching import generate_batch

    ids = [target.encode(p, chat=True) for p in prompts]
    # (not scored here: score_answers scores them, once)
    results = generate_batch(
        target, None, ids, "ar", seed=seed, max_new_tokens=max_new_tokens,
        temperature=0.0 if greedy else 1.0, top_k=0, top_p=1.0, score=False,
    )  # fmt: skip
    kept = [(i, r.token_ids) for i, r in enumerate(results) if len(r.token_ids) >= 2]
    return score_answers(target, [ids[i] for i, _ in kept], [a for _, a in kept], greedy, source="target")


@torch.inference_mode()
def score_answers(
    target, prompt_ids: list[list[int]], answers: list[list[int]], greedy: bool, source: str = "draft"
) -> list[dict]:
    """Rows for written answers (`source`: who wrote them): the target's distributions at every answer
    position, from one forward pass over the right-padded batch (right padding keeps every row's positions
    0, 1, ...)."""
    seqs = [p + a for p, a in zip(prompt_ids, answers, strict=True)]
    width = max(len(x) for x in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, x in enumerate(seqs):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    model = target.model
    hidden = model.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device)).last_hidden_state
    rows = []
    for i, (p, a) in enumerate(zip(prompt_ids, answers, strict=True)):
        # position len(p) - 1 + j predicts answer token j; the head runs on those positions only
        logits = model.lm_head(hidden[i, len(p) - 1 : len(p) - 1 + len(a)])[..., : target.vocab_size]
        rows.append(_row(p, a, logits.cpu(), greedy, source=source))
    return rows


@torch.inference_mode()
def draft_answer_batch(
    draft, target, prompt_ids: list[list[int]], max_new_tokens: int, greedy: bool, seed: int
) -> list[dict]:
    """The draft (a causal LM with the target's vocabulary) answers the prompts, by sampling at temperature
    1 or greedily; the target scores its answers."""
    eos = target.eos_token_id
    pad = eos if target.tokenizer.pad_token_id is None else target.tokenizer.pad_token_id
    input_ids, mask = _left_padded(prompt_ids, pad)
    torch.manual_seed(seed)
    sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    was_training = draft.training
    draft.eval()
    try:
        out = draft.generate(
            input_ids.to(draft.device),
            attention_mask=mask.to(draft.device),
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            eos_token_id=eos,
            **sampling,
        )
    finally:
        draft.train(was_training)
    kept, answers = [], []
    for p, gen in zip(prompt_ids, out[:, input_ids.shape[1] :].tolist(), strict=True):
        n = _answer_length(gen, eos)
        if n >= 2:
            kept.append(p)
            answers.append(gen[:n])
    return score_answers(target, kept, answers, greedy) if kept else []


def _write_shards(folder: Path, items: list, batch_size: int, make_rows, progress=None) -> list[Path]:
    """`make_rows(b, chunk)` for every batch of `items` not yet in `folder`, each saved atomically as a shard;
    shards already there are kept, so an interrupted run continues after the last finished batch."""
    folder.mkdir(parents=True, exist_ok=True)
    batches = [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
    if progress is not None:
        progress(0, len(batches), None)
    for b, chunk in enumerate(batches):
        path = shard_path(folder, b)
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            torch.save(make_rows(b, chunk), tmp)
            os.replace(tmp, path)
        if progress is not None:
            progress(b + 1, len(batches), path)
    return [shard_path(folder, b) for b in range(len(batches))]


def build_dataset(
    target,
    prompts: list[str],
    folder: Path,
    batch_size: int = 16,
    max_new_tokens: int = 192,
    greedy_every: int = 2,
    seed: int = 0,
    progress=None,
) -> list[Path]:
    """Answer `prompts` in batches; every `greedy_every`-th batch greedily, the others by sampling at
    temperature 1 (the draft serves both). Returns all shard paths, reusing those already written."""
    return _write_shards(
        folder,
        prompts,
        batch_size,
        progress=progress,
        make_rows=lambda b, chunk: answer_batch(
            target, chunk, max_new_tokens, greedy=(b % greedy_every == 0), seed=seed + b * batch_size
        ),
    )


def build_on_policy(
    draft,
    target,
    prompt_ids: list[list[int]],
    folder: Path,
    batch_size: int = 32,
    max_new_tokens: int = 160,
    greedy_every: int = 2,
    seed: int = 0,
    progress=None,
) -> list[Path]:
    """`build_dataset` with the draft writing the answers (`draft_answer_batch`), shards reused the same way."""
    return _write_shards(
        folder,
        prompt_ids,
        batch_size,
        progress=progress,
        make_rows=lambda b, chunk: draft_answer_batch(
            draft,
            target,
            chunk,
            max_new_tokens,
            greedy=(b % greedy_every == 0),
            seed=int(np.random.SeedSequence([seed, b]).generate_state(1)[0]),
        ),
    )


def load_rows(paths: list[Path]) -> list[dict]:
    rows = []
    for p in paths:
        rows.extend(torch.load(p, weights_only=True))
    return rows


def user_turn_prefix(tokenizer) -> str:
    """The chat text up to where a user's message begins (the default system prompt included)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("self-written prompts need a target whose tokenizer has a chat template")
    marker = "\x00USER\x00"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=True
    )
    return text.split(marker)[0]


def self_written_prompts(
    target,
    n: int,
    batch_size: int = 32,
    max_new_tokens: int = 96,
    seed: int = 0,
    keep=lambda text: True,
    state: dict | None = None,
    on_batch=None,
) -> list[str]:
    """`n` user messages written by the target itself, sampled at temperature 1 after the chat prefix of
    a user turn: requests in the target's own chat distribution, which a fixed pool of templates does not
    reach. Written by the batched engine (`generate_batch`, `ar`, nothing cut from the law). Only finished
    turns (ending in a stop token) of 4+ words that `keep` accepts are kept, without repeats; after 4x the
    batches that `n` needs it stops with what it has.

    `state` ({"batches": done, "prompts": [...]}, as passed to `on_batch(state)` after every batch)
    continues an interrupted call where it stopped, with the same result as an uninterrupted one."""
    from ...batching import generate_batch

    ids = target.tokenizer(user_turn_prefix(target.tokenizer), add_special_tokens=False)["input_ids"]
    stops = target.stop_tokens
    state = {"batches": 0, "prompts": [], **(state or {})}
    out, seen = list(state["prompts"]), set(state["prompts"])
    for b in range(state["batches"], 4 * -(-n // batch_size)):
        if len(out) >= n:
            break
        # batch b is the same whether or not the call was interrupted before it; every input is the same
        # prefix, so (seed, b) is mixed rather than added: seed + b would make seed 1 repeat seed 0's batches
        # (row i of the batch is seeded `first + i`)
        first = int(np.random.SeedSequence([seed, b]).generate_state(1)[0])
        results = generate_batch(
            target, None, [ids] * batch_size, "ar", seed=first, max_new_tokens=max_new_tokens,
            temperature=1.0, top_k=0, top_p=1.0, score=False,
        )  # fmt: skip
        for result in results:
            row = result.token_ids
            if not row or row[-1] not in stops:
                continue  # ran out of tokens mid-message
            text = target.tokenizer.decode(row[:-1], skip_special_tokens=True).strip()
            if len(text.split()) >= 4 and text not in seen and keep(text):
                seen.add(text)
                out.append(text)
        if on_batch is not None:
            on_batch({"batches": b + 1, "prompts": list(out)})
    return out[:n]
