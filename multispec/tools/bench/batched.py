"""`multispec bench --batch N[,N...]`: every method decoding the whole prompt set N sequences at a time
(`multispec.generate_batch`, continuous batching), beside transformers' own batched `generate` (`hf`: the prompts
left-padded into batches of N), in one run. One row per (rows, temperature, method): tokens made, wall seconds,
aggregate tokens/s, tokens per target call, and the ratios to the baseline and to `hf` at the same N.

Written to the output folder as it goes: batch.jsonl (a row per run, so an interrupted run resumes with
--resume), then batch.md (the table) and batch.png (tokens/s and tokens per target call against N)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from ...batching import generate_batch
from ...decoding import METHODS
from ...models.base import LanguageModel
from ...warp import Sampling
from .prompts import Prompt
from .runner import BASELINES, MethodSpec, _prompt_ids, check_settings, plan

BATCH_RESULTS = "batch.jsonl"
BATCHED_PEERS = ("hf",)  # transformers' padded `generate`; its assisted, lookup and static peers decode one sequence


def run_batched(
    target: LanguageModel,
    draft: LanguageModel | None,
    prompts: list[Prompt],
    methods: list[str | MethodSpec],
    out: str | Path,
    rows: list[int],
    *,
    temperatures: list[float] = (0.0,),
    max_new_tokens: int = 128,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    chat: bool = True,
    baseline: str = "ar",
    resume: bool = False,
    force: bool = False,
    warmup: bool = True,
    progress: bool = True,
) -> list[dict]:
    """Run every method over all `prompts`, `n` sequences at a time, for each n of `rows`; returns the rows
    written (earlier ones included, on --resume). Prompt i is seeded `seed + i`, as `generate_batch` seeds it."""
    specs, base_label = plan(methods, baseline)
    check_settings(list(temperatures), max_new_tokens, top_k, top_p)
    if not prompts:
        raise ValueError("no prompts to run")
    if not rows or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in rows):
        raise ValueError(f"--batch takes row counts of at least 1, got {rows!r}")
    for s in specs:
        if s.name in BASELINES and s.name not in BATCHED_PEERS:
            raise ValueError(
                f"{s.label!r} decodes one sequence at a time; in a batched bench the peer is "
                + ", ".join(BATCHED_PEERS)
            )
        if s.needs_draft and draft is None:
            raise ValueError(f"method {s.label!r} needs a draft model; none was given")
    out = Path(out)
    path = out / BATCH_RESULTS
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    if path.exists() and not (resume or force):
        raise ValueError(f"{path} exists: pass --resume to continue that run, --force to start again, or another --out")
    out.mkdir(parents=True, exist_ok=True)
    if force and not resume:
        path.unlink(missing_ok=True)
    settings = {"target": target.name, "draft": getattr(draft, "name", None), "max_new_tokens": max_new_tokens,
                "top_k": top_k, "top_p": top_p, "seed": seed, "chat": chat, "prompts": len(prompts)}  # fmt: skip
    done = {}
    for row in _read(path) if resume else []:
        if row.get("settings") != settings:
            raise ValueError(f"{path} was made with other settings; use another --out for these")
        done[(row["rows"], row["method"], row["temperature"])] = row
    cache: dict = {}
    ids = [_prompt_ids(target, p, chat, cache) for p in prompts]
    todo = [
        (n, t, s)
        for n in rows
        for t in temperatures
        for s in specs
        if (n, s.label, float(t)) not in done and (t > 0 or s.name in BASELINES or METHODS[s.name].greedy)
    ]
    if warmup:  # lazy initialisation and the batched step's cost curve, out of the timed runs
        for t, s in {s.label: (t, s) for _, t, s in todo}.values():
            _decode(s, target, draft, ids[:2], 2, 4, Sampling(t, top_k, top_p), seed)
    from tqdm import tqdm

    bar = tqdm(total=len(todo), file=sys.stderr, disable=not progress, unit="run", dynamic_ncols=True)
    with open(path, "a", encoding="utf-8") as log:
        for n, t, s in todo:
            bar.set_postfix_str(f"{n} rows, T={t:g}, {s.label}", refresh=False)
            row = {"rows": n, "temperature": float(t), "method": s.label, "method_name": s.name}
            try:
                t0 = time.perf_counter()
                tokens, calls = _decode(s, target, draft, ids, n, max_new_tokens, Sampling(t, top_k, top_p), seed)
                seconds = time.perf_counter() - t0
                row.update(
                    new_tokens=tokens,
                    seconds=seconds,
                    tokens_per_second=tokens / seconds,
                    target_calls=calls,
                    tokens_per_target_call=tokens / calls if calls else None,
                    error=None,
                )
            except Exception as e:  # one method failing must not end the run
                row.update(new_tokens=None, seconds=None, tokens_per_second=None, target_calls=None, error=str(e))
            row["settings"] = settings
            log.write(json.dumps(row) + "\n")
            log.flush()
            done[(n, s.label, float(t))] = row
            bar.update(1)
    bar.close()
    written = sorted(done.values(), key=lambda r: (r["rows"], r["temperature"], r["method"] != base_label))
    write_table(out, written, base_label)
    plot(out, written)
    return written


def _decode(spec: MethodSpec, target, draft, ids, rows, max_new_tokens, sampling, seed) -> tuple[int, int | None]:
    """Decode every prompt, `rows` at a time: (new tokens made, target calls; None for the peer)."""
    if spec.name == "hf":
        return hf_batched(target, ids, rows, max_new_tokens, sampling, seed), None
    results = generate_batch(
        target,
        draft,
        ids,
        spec.name,
        seed=seed,
        rows=min(rows, len(ids)),
        max_new_tokens=max_new_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        score=False,  # (as the bench's single-sequence runs: no scoring forward timed)
        **spec.params,
    )
    return sum(len(r.token_ids) for r in results), sum(r.stats["target_calls"] for r in results)


@torch.inference_mode()
def hf_batched(target, ids: list[list[int]], rows: int, max_new_tokens: int, sampling: Sampling, seed: int) -> int:
    """transformers' `generate` as it ships, `rows` prompts at a time, left-padded (its documented way to batch):
    the new tokens up to each row's first stop token."""
    model = getattr(target, "model", None)
    if model is None or not hasattr(model, "generate"):
        raise ValueError(f"{target.name} is not a transformers model: the hf peer runs only on those")
    pad = getattr(getattr(target, "tokenizer", None), "pad_token_id", None)
    pad = pad if pad is not None else (target.eos_token_id if target.eos_token_id is not None else 0)
    stops = set(target.stop_tokens)
    made = 0
    for start in range(0, len(ids), rows):
        chunk = ids[start : start + rows]
        width = max(map(len, chunk))
        input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, p in enumerate(chunk):
            input_ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        kwargs = {"do_sample": False}
        if sampling.temperature > 0:
            kwargs = {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k or None}
            kwargs["top_p"] = sampling.top_p
            torch.manual_seed(seed + start)
        output = model.generate(
            input_ids=input_ids.to(target.device),
            attention_mask=mask.to(target.device),
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            eos_token_id=sorted(stops) or None,
            **kwargs,
        )
        for row in output[:, width:].tolist():
            stop = next((i for i, token in enumerate(row) if token in stops), None)
            made += len(row) if stop is None else stop + 1
    return made


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line cut by an interruption
            continue
    return rows


def write_table(out: Path, rows: list[dict], base_label: str) -> None:
    """batch.md: a row per method and temperature, a column per row count: tokens/s, tokens per target call, and
    the ratios to the baseline and to `hf` at that row count."""
    at = {(r["rows"], r["temperature"], r["method"]): r for r in rows}
    counts = sorted({r["rows"] for r in rows})
    lines = [
        "| method | T | " + " | ".join(f"{n} rows" for n in counts) + " |",
        "|---|---|" + "---|" * len(counts),
    ]
    for method, t in dict.fromkeys((r["method"], r["temperature"]) for r in rows):
        cells = []
        for n in counts:
            r = at.get((n, t, method))
            if r is None or r.get("tokens_per_second") is None:
                cells.append("error" if r is not None else "")
                continue
            cell = f"{r['tokens_per_second']:.1f} tok/s"
            if r.get("tokens_per_target_call"):
                cell += f", {r['tokens_per_target_call']:.2f}/call"
            for label, other in ((base_label, at.get((n, t, base_label))), ("hf", at.get((n, t, "hf")))):
                if other and other.get("tokens_per_second") and method != label:
                    cell += f", {r['tokens_per_second'] / other['tokens_per_second']:.2f}x {label}"
            cells.append(cell)
        lines.append(f"| `{method}` | {t:g} | " + " | ".join(cells) + " |")
    (out / "batch.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(out: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({r["rows"] for r in rows})
    fig, (speed, calls) = plt.subplots(1, 2, figsize=(10, 4))
    for method, t in dict.fromkeys((r["method"], r["temperature"]) for r in rows):
        mine = sorted(
            (r for r in rows if (r["method"], r["temperature"]) == (method, t) and r.get("tokens_per_second")),
            key=lambda r: r["rows"],
        )
        label = f"{method}, T={t:g}"
        speed.plot([r["rows"] for r in mine], [r["tokens_per_second"] for r in mine], marker="o", label=label)
        with_calls = [r for r in mine if r.get("tokens_per_target_call")]
        calls.plot([r["rows"] for r in with_calls], [r["tokens_per_target_call"] for r in with_calls], marker="o")
    for ax, label in ((speed, "tokens/s, all rows"), (calls, "tokens per target call")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.set_xlabel("sequences decoded together")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    speed.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "batch.png", dpi=120)
    plt.close(fig)
