"""The run loop: methods x prompts x temperatures on one model pair, one row per generation appended to
results.jsonl as soon as it is done (an interrupted run loses at most the generation in flight and
`resume=True` continues it).

Methods come from the registry `multispec.decoding.METHODS` (so methods added later are benchmarkable
as they are) plus peers from outside the project: `hf` (transformers' `generate`), `hf-assisted`
(`generate` with `assistant_model` = the draft), `hf-lookup` (`generate` with prompt lookup) and `hf-static`
(its static cache and compiled forward) run on the models as transformers ships them (this project's
attention function is switched off for them); `llama-cpp` runs llama.cpp on a GGUF file of the target where
`llama-cpp-python` is installed (`llamacpp.py`).
"""

from __future__ import annotations

import json
import os
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...api import generate
from ...decoding import METHODS
from ...models.base import LanguageModel
from ...params import parse_method
from ...warp import Sampling
from . import llamacpp, metrics, sweep
from .energy import Meter, pick_meter
from .memory import PeakMemory
from .prompts import Prompt

BASELINES = {
    "hf": "transformers generate() on the target alone",
    "hf-assisted": "transformers generate() with assistant_model = the draft (its assisted decoding)",
    "hf-lookup": "transformers generate() with prompt_lookup_num_tokens=10 (its prompt lookup decoding)",
    "hf-static": "transformers generate() with a static cache and torch.compile on the forward (its documented "
    "fast path)",
    "llama-cpp": "llama.cpp (llama-cpp-python) on a GGUF file of the target; optional, not run by default",
}
OPTIONAL = {"llama-cpp"}  # peers that need a package the project does not depend on: listed, never defaults
HF_LOOKUP_TOKENS = 10  # transformers' documented example value
RESULTS = "results.jsonl"
# what a measured row holds beyond its key; a failed row holds them as None (one schema for every row)
MEASURED = (
    "new_tokens",
    "seconds",
    "tokens_per_second",
    "target_calls",
    "draft_calls",
    "block_efficiency",
    "acceptance_rate",
    "stopped",
    "mean_logprob",
    "perplexity",
    "energy_j",
    "j_per_token",
    "reference",
    "rouge_l",
    "bleu",
    "exact_match",
    "text",
    "token_ids",
    "prompt_tokens",
    "predicted_tokens_per_second",
    "decode_tokens_per_second",
    "drafter_iterations",
    "accepted_length_histogram",
    "position_acceptance",
    "peak_memory_mb",
    "one_time_seconds",
    "compiles",
    "graph_captures",
    "target_seconds",
    "prefill_seconds",
    "draft_seconds",
    "other_seconds",
    "target_forwards",
    "draft_forwards",
)


@dataclass(frozen=True)
class MethodSpec:
    label: str  # as shown in the report: "sd:gamma=4"
    name: str  # registry name, or "hf" / "hf-assisted"
    params: dict[str, Any] = field(default_factory=dict)  # resolved (defaults filled in)
    needs_draft: bool = False


def parse_method_spec(text: str) -> MethodSpec:
    """'sd:gamma=4,bonus=false' -> MethodSpec, checked against the registry (or a baseline) without a model."""
    name, given = parse_method(text)
    label = name + (":" + ",".join(f"{k}={v}" for k, v in given.items()) if given else "")
    if name in BASELINES:
        if given:
            raise ValueError(f"the baseline {name!r} takes no parameters, got {', '.join(given)}")
        if name == "llama-cpp":
            llamacpp.require()
        return MethodSpec(label, name, {}, needs_draft=name == "hf-assisted")
    if name not in METHODS:
        known = ", ".join([*sorted(METHODS), *BASELINES])
        raise ValueError(f"unknown method {name!r}; known methods: {known} (hf* are the bench's baselines)")
    method = METHODS[name]
    if method.markov_only:
        raise ValueError(f"method {name!r} runs only on MarkovLM test models, not in a bench of real models")
    params = method.resolve(given)
    return MethodSpec(label, name, params, method.draft_use(params) == "required")


def default_methods(with_draft: bool = True) -> list[str]:
    """Every registered method at its defaults, then the hf baselines (those needing a draft only with one);
    the optional peers only when asked for."""
    names = [
        *sorted((n for n in METHODS if not METHODS[n].markov_only), key=lambda n: (n != "ar", n)),
        *(b for b in BASELINES if b not in OPTIONAL),
    ]
    return [n for n in names if with_draft or not _needs_draft(n)]


def _needs_draft(name: str) -> bool:
    if name in BASELINES:
        return name == "hf-assisted"
    return METHODS[name].draft_use(METHODS[name].resolve({})) == "required"


def plan(methods: list[str | MethodSpec], baseline: str = "ar") -> tuple[list[MethodSpec], str]:
    """Parse the method specs; the baseline (a label, or a method name) is added first when not listed.
    Returns (specs, the baseline's label)."""
    specs = [m if isinstance(m, MethodSpec) else parse_method_spec(m) for m in methods]
    labels = [s.label for s in specs]
    for lab in labels:
        if labels.count(lab) > 1:
            raise ValueError(f"method {lab!r} is listed twice")
    match = [s for s in specs if s.label == baseline] or [s for s in specs if s.name == baseline]
    if match:
        return specs, match[0].label
    base = parse_method_spec(baseline)
    return [base, *specs], base.label


def check_settings(temperatures, max_new_tokens, top_k, top_p) -> None:
    if not temperatures:
        raise ValueError("give at least one temperature")
    for t in temperatures:
        Sampling(t, top_k, top_p)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def prepare_out(out: str | Path, resume: bool = False, force: bool = False, delete: bool = True) -> Path:
    """The output folder, checked before any model is loaded. With `force` (and `delete`: the main process
    of a sweep), an earlier run's results and shards are removed."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    results = out / RESULTS
    if (results.exists() or sweep.shard_files(out)) and not (resume or force):
        raise ValueError(
            f"{results if results.exists() else out / sweep.SHARDS} exists: pass --resume to continue "
            "that run, --force to start again, or choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    if force and not resume and delete:
        results.unlink(missing_ok=True)
        sweep.remove_shards(out)
    return out


def read_results(path: str | Path, repair: bool = True) -> list[dict]:
    """The rows of a results.jsonl. A cut last line (the run was killed while writing it) is dropped, and
    with `repair` removed from the file, so that appending continues cleanly (never repair a file another
    process may be writing); a bad line elsewhere is an error."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):
                if repair:
                    path.write_text("".join(lines[:-1]), encoding="utf-8")
                break
            raise ValueError(f"{path} line {n} is not valid JSON; it is not a results file of this harness") from None
    return rows


def row_key(prompt_id: str, method: str, temperature: float) -> tuple[str, str, float]:
    return (prompt_id, method, float(temperature))


def prompt_seed(seed: int, prompt_id: str) -> int:
    """One seed per prompt, the same for every method and temperature (paired comparisons), and stable
    when --limit or --categories change which prompts run."""
    return zlib.crc32(f"{seed}:{prompt_id}".encode())


def run_bench(
    target: LanguageModel,
    draft: LanguageModel | None,
    prompts: list[Prompt],
    methods: list[str | MethodSpec] | None = None,
    out: str | Path = "bench-out",
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
    meter: Meter | None | str = "auto",
    progress: bool = True,
    models: dict[str, str] | None = None,
    state=None,
    gguf: str | Path | None = None,
) -> dict | None:
    """Run the benchmark, write results.jsonl, summary.json, report.md and the plots in `out`; return the
    summary. `meter="auto"` picks a readable energy counter for the target's device, None measures none.

    `state`: accelerate's process state when the run is spread over processes (`sweep`): this process runs
    every N-th prompt into its shard, and the main process merges the shards, writes the report and returns
    the summary (the others return None).

    `gguf`: the GGUF file the `llama-cpp` peer runs (default: the shipped one, for the default target)."""
    from .report import write_report

    specs, base_label = plan(methods if methods is not None else default_methods(draft is not None), baseline)
    check_settings(list(temperatures), max_new_tokens, top_k, top_p)
    if not prompts:
        raise ValueError("no prompts to run")
    if draft is None:
        needing = [s.label for s in specs if s.needs_draft]
        if needing:
            raise ValueError(f"method {needing[0]!r} needs a draft model; none was given")
    peers = {}
    if any(s.name == "llama-cpp" for s in specs):  # loaded once, before the run; a wrong file fails here
        peers["llama-cpp"] = llamacpp.LlamaCppPeer(llamacpp.gguf_for(target, gguf), torch.get_num_threads(), target)
    rank, count = (state.process_index, state.num_processes) if state is not None else (0, 1)
    main_process = rank == 0
    out = prepare_out(out, resume, force, delete=main_process)
    if count > 1:
        state.wait_for_everyone()  # the main process has cleared the folder (--force)
    settings = {
        "target": target.name,
        "draft": draft.name if draft is not None else None,
        "max_new_tokens": max_new_tokens,
        "top_k": top_k,
        "top_p": top_p,
        "seed": seed,
        "chat": chat,
    }
    results = out / RESULTS
    own = results if count == 1 else sweep.shard_path(out, rank)
    own.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    earlier = [results, *sweep.shard_files(out)] if resume else []
    rows_before = [row for path in earlier for row in read_results(path, repair=path == own)]
    if count > 1:
        state.wait_for_everyone()  # every process has read what is done before any writes
    for row in rows_before:
        if row.get("settings") != settings:
            old = row.get("settings") or {}
            diff = ", ".join(f"{k} {old.get(k)!r} there, {v!r} now" for k, v in settings.items() if old.get(k) != v)
            raise ValueError(f"{results} was made with other settings ({diff}); use another --out for these")
        done.add(row_key(row["prompt_id"], row["method"], row["temperature"]))
    if meter == "auto":
        meter = pick_meter(str(target.device))

    load_start = _load()
    mine = prompts[rank::count]
    todo = [
        (t, p, s)
        for t in temperatures
        for p in mine
        for s in specs
        if row_key(p.id, s.label, t) not in done and (t > 0 or s.name in BASELINES or METHODS[s.name].greedy)
    ]
    skipped = sorted(
        {s.label for s in specs if s.name not in BASELINES and not METHODS[s.name].greedy}
        if 0 in temperatures
        else set()
    )
    progress = progress and main_process
    if skipped and progress:
        print(f"bench: {', '.join(skipped)} only sample: not run at temperature 0", file=sys.stderr)
    ids_cache: dict[str, list[int]] = {}
    if any(s.name == "hf-static" for s in specs):
        # transformers sizes its static cache per call unless told the largest length to expect; a cache that
        # grows recompiles the forward inside a timed row, so give it the run's longest prompt + new tokens
        lengths = {p.id: len(_prompt_ids(target, p, chat, ids_cache)) for p in prompts}
        peers["hf-static"] = {"max_cache_len": max(lengths.values()) + max_new_tokens}
    if warmup:  # first calls pay for lazy initialisation; keep that out of the measurements
        from ...models.cost import forward_cost, padded_tokens

        for model in (target, draft):
            if model is not None and padded_tokens(model):
                # a compiled model's cost curve, measured here: each bucket's graph timed (and a bucket whose
                # autotuned kernel ran slower than a larger one's routed to it), as gamma=auto and tree=auto read
                forward_cost(model, here=True, batch_invariant=model is target)
        for t, _, spec in {s.label: (t, p, s) for t, p, s in todo}.values():
            # a compiled prefill (hf-static) specialises on the first prompt's length and recompiles, once,
            # with a dynamic length at the second: warm it up on two lengths
            for prompt in _warmup_prompts(prompts, spec, chat, target, ids_cache):
                try:
                    ids = _prompt_ids(target, prompt, chat, ids_cache)
                    _generate(spec, target, draft, ids, min(8, max_new_tokens), Sampling(t, top_k, top_p), 0, peers)
                except Exception:  # the same failure is recorded on the measured rows
                    pass

    from tqdm import tqdm

    bar = tqdm(total=len(todo), file=sys.stderr, disable=not progress, unit="gen", dynamic_ncols=True)
    with open(own, "a", encoding="utf-8") as log:
        for t, prompt, spec in todo:
            bar.set_postfix_str(f"T={t:g} {spec.label} {prompt.id}", refresh=False)
            row = {
                "prompt_id": prompt.id,
                "category": prompt.category,
                "method": spec.label,
                "method_name": spec.name,
                "params": spec.params,
                "temperature": float(t),
                "seed": prompt_seed(seed, prompt.id),
            }
            try:
                ids = _prompt_ids(target, prompt, chat, ids_cache)
                row.update(
                    _measure(
                        spec,
                        target,
                        draft,
                        ids,
                        prompt.reference,
                        max_new_tokens,
                        Sampling(t, top_k, top_p),
                        row["seed"],
                        meter,
                        peers,
                    )
                )
                row["error"] = None
            except Exception as e:  # one method failing on one prompt must not end the run
                row.update(dict.fromkeys(MEASURED))
                row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())}"
            row["settings"] = settings
            log.write(json.dumps(row) + "\n")
            log.flush()
            bar.update(1)
    bar.close()

    if count > 1:
        state.wait_for_everyone()
    if main_process and (count > 1 or sweep.shard_files(out)):  # (also a sweep resumed in one process)
        merge_shards(out, [row_key(p.id, s.label, t) for t in temperatures for p in prompts for s in specs])
    if count > 1:
        state.wait_for_everyone()
        if not main_process:
            return None
    meta = {
        "settings": settings,
        "models": models or {},
        "baseline": base_label,
        "methods": [s.label for s in specs],
        "temperatures": [float(t) for t in temperatures],
        "prompts": len(prompts),
        "meter": meter.name if meter is not None else None,
        "device": str(target.device),
        "torch": torch.__version__,
        "processes": count,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_average": [load_start, _load()],
    }
    return write_report(out, read_results(results), meta)


def merge_shards(out: str | Path, order: list[tuple]) -> list[dict]:
    """Merge results.jsonl and every shard into results.jsonl: each row once, in `order` (row keys as a
    one-process run writes them), rows outside it (an earlier run's other methods) after, in file order.
    The file is replaced in one step and the shards removed after."""
    out = Path(out)
    rows: dict[tuple, dict] = {}
    for path in [out / RESULTS, *sweep.shard_files(out)]:
        for row in read_results(path):
            rows.setdefault(row_key(row["prompt_id"], row["method"], row["temperature"]), row)
    place = {key: i for i, key in enumerate(order)}
    merged = sorted(
        rows.values(), key=lambda r: place.get(row_key(r["prompt_id"], r["method"], r["temperature"]), len(place))
    )
    tmp = out / (RESULTS + ".merging")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in merged), encoding="utf-8")
    os.replace(tmp, out / RESULTS)
    sweep.remove_shards(out)
    return merged


def _prompt_ids(target: LanguageModel, prompt: Prompt, chat: bool, cache: dict) -> list[int]:
    if prompt.id not in cache:
        cache[prompt.id] = target.encode(prompt.text, chat=chat) if isinstance(prompt.text, str) else list(prompt.text)
    return cache[prompt.id]


def _measure(spec, target, draft, ids, reference, max_new_tokens, sampling, seed, meter, peers=None) -> dict:
    _sync(target)
    before = meter.read() if meter is not None else None
    with PeakMemory(target.device) as peak:
        tokens, stats = _generate(spec, target, draft, ids, max_new_tokens, sampling, seed, peers)
        _sync(target)
    energy = meter.joules(before, meter.read()) if meter is not None else None
    n = len(tokens)
    text = target.decode(tokens)
    row = {
        "new_tokens": n,
        "seconds": stats["seconds"],
        "tokens_per_second": n / stats["seconds"] if stats["seconds"] > 0 else None,
        "target_calls": stats["target_calls"],
        "draft_calls": stats["draft_calls"],
        "block_efficiency": n / stats["target_calls"] if stats["target_calls"] else None,
        "acceptance_rate": stats.get("acceptance_rate"),
        "stopped": stats.get("stopped"),
        "mean_logprob": metrics.mean_logprob(target, ids, tokens),  # outside the timed call
        "energy_j": energy,
        "j_per_token": energy / n if energy is not None and n else None,
        "peak_memory_mb": peak.bytes / 2**20 if peak.bytes is not None else None,
        "reference": reference,
        "rouge_l": None,
        "bleu": None,
        "exact_match": None,
    }
    row["perplexity"] = metrics.perplexity([row["mean_logprob"]])
    if reference is not None and text is not None:
        row.update(
            rouge_l=metrics.rouge_l(text, reference),
            bleu=metrics.bleu(text, reference),
            exact_match=metrics.exact_match(text, reference),
        )
    row.update(text=text, token_ids=tokens, prompt_tokens=len(ids))
    for key in (
        "predicted_tokens_per_second",
        "decode_tokens_per_second",
        "drafter_iterations",
        "accepted_length_histogram",
        "position_acceptance",
        "one_time_seconds",
        "compiles",
        "graph_captures",
        "target_seconds",
        "prefill_seconds",
        "draft_seconds",
        "other_seconds",
        "target_forwards",
        "draft_forwards",
    ):
        row[key] = stats.get(key)
    return row


def _generate(spec, target, draft, ids, max_new_tokens, sampling, seed, peers=None) -> tuple[list[int], dict]:
    if spec.name == "llama-cpp":
        return peers["llama-cpp"].generate(ids, max_new_tokens, sampling, seed, target.stop_tokens)
    if spec.name in BASELINES:
        return hf_generate(
            target,
            draft if spec.name == "hf-assisted" else None,
            ids,
            max_new_tokens,
            sampling,
            seed,
            lookup=HF_LOOKUP_TOKENS if spec.name == "hf-lookup" else 0,
            static=spec.name == "hf-static",
            max_cache_len=(peers or {}).get("hf-static", {}).get("max_cache_len"),
        )
    r = generate(
        target,
        draft,
        ids,
        method=spec.name,
        max_new_tokens=max_new_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        seed=seed,
        score=False,
        **spec.params,
    )  # scored in `_measure`, for the hf baselines too
    return r.token_ids, r.stats


def hf_generate(
    target,
    draft,
    ids: list[int],
    max_new_tokens: int,
    sampling: Sampling,
    seed: int,
    lookup: int = 0,
    static: bool = False,
    max_cache_len: int | None = None,
):
    """transformers' own generate() on the target's underlying model as transformers ships it (with the draft
    as assistant_model when given, with prompt lookup of `lookup` tokens when > 0; with `static`, the fast
    path transformers documents: `cache_implementation="static"` and the forward through `torch.compile`,
    compiled once per model and kept, with the static cache sized to `max_cache_len` when given, so that calls
    with other lengths reuse the compiled forward), timed like `multispec.generate` (prefill included). Forward
    calls are counted with hooks."""
    from ...models.hf import HFModel
    from ...models.static import stock_attention

    if not isinstance(target, HFModel) or (draft is not None and not isinstance(draft, HFModel)):
        raise ValueError("the hf baselines need Hugging Face models (HFModel)")
    inputs = torch.tensor([ids], device=target.device)
    if sampling.greedy:
        kwargs = {"do_sample": False}
    else:  # top_k=0 turns off transformers' default top-k of 50
        kwargs = {
            "do_sample": True,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
        }
    if draft is not None:
        kwargs["assistant_model"] = draft.model
    if lookup:
        kwargs["prompt_lookup_num_tokens"] = lookup
    if static:
        # compiled here, on every device; transformers would compile the forward again on a GPU (nested, it
        # crashed there)
        kwargs.update(cache_implementation="static", disable_compile=True)
        if max_cache_len is not None:
            kwargs["max_cache_len"] = max_cache_len
        if getattr(target, "_hf_compiled_forward", None) is None:
            compiled = torch.compile(target.model.forward, mode="reduce-overhead", fullgraph=True)

            def forward(*args, **kwargs):
                # on a GPU each call replays a CUDA graph whose outputs the next replay overwrites; generate
                # keeps the last call's tensors, so each call starts a new step (torch's advice)
                torch.compiler.cudagraph_mark_step_begin()
                return compiled(*args, **kwargs)

            target._hf_compiled_forward = forward
        target.model.forward = target._hf_compiled_forward
    calls = {"target": 0, "draft": 0}
    hooks = [
        m.model.register_forward_pre_hook(lambda *_, k=k: calls.__setitem__(k, calls[k] + 1))
        for k, m in (("target", target), ("draft", draft))
        if m is not None
    ]
    torch.manual_seed(seed)
    try:
        t0 = time.perf_counter()
        with torch.inference_mode(), stock_attention(target.model, draft.model if draft is not None else None):
            out = target.model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=max_new_tokens,
                pad_token_id=target.eos_token_id if target.eos_token_id is not None else 0,
                **kwargs,
            )
        _sync(target)
        seconds = time.perf_counter() - t0
    finally:
        for h in hooks:
            h.remove()
        if static:
            del target.model.forward  # the class's forward again
    tokens = out[0, len(ids) :].tolist()
    stopped = "eos" if tokens and tokens[-1] in target.stop_tokens else "length"
    return tokens, {
        "seconds": seconds,
        "target_calls": calls["target"],
        "draft_calls": calls["draft"],
        "acceptance_rate": None,
        "stopped": stopped,
    }


def _warmup_prompts(prompts: list[Prompt], spec: MethodSpec, chat: bool, target, ids_cache: dict) -> list[Prompt]:
    """The prompts a method is warmed up on: the first, and for hf-static also one of another length."""
    if spec.name != "hf-static":
        return prompts[:1]
    first = len(_prompt_ids(target, prompts[0], chat, ids_cache))
    other = next((p for p in prompts[1:] if len(_prompt_ids(target, p, chat, ids_cache)) != first), None)
    return prompts[:1] + ([other] if other is not None else [])


def _load() -> float | None:
    """The 1-minute load average: other work on the machine makes every timing noisier."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def _sync(model: LanguageModel) -> None:
    if getattr(model.device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(model.device)
