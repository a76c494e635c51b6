"""Public entry points: `load_pair` and `generate`."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .decoding import get_method
from .engine import Session
from .likelihood import mean_logprob, perplexity
from .models.base import LanguageModel
from .models.default import DEFAULT_NAMES, DRAFT_NAME, TARGET_NAME, load_default
from .models.eagle import is_eagle, load_eagle
from .models.hf import HFModel, background, default_dtype
from .params import DEFAULT_METHOD, parse_method
from .result import Result, Stats
from .warp import Sampling


@dataclass
class ModelPair:
    target: LanguageModel
    draft: LanguageModel | None
    description: dict[str, str] = field(default_factory=dict)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def load_model(
    name: str | None,
    device: str | None = None,
    default: str = TARGET_NAME,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict | None = None,
    compile: bool | str = "auto",
    role: str = "target",
) -> LanguageModel:
    """A default model by name (see `DEFAULT_NAMES`: the target, its trained draft, its bfloat16 copy), else a
    hub id or path. `dtype` (float32, bfloat16, float16; default bfloat16 where the hardware has fast
    bfloat16, else float32); `device_map` (e.g. "auto", through accelerate) spreads a hub model too large for
    one device over several; `compile`: "auto" (compiled where that pays and its steps are ready on this machine,
    else eager, compiling them in the background: `models/hf/background.py`), False (eager), True, "invariant"
    or "fast" (compiled now, see `HFModel`); `role`: "target" or "draft" (what "auto" prepares it for)."""
    name = name or default
    if compile not in (False, "auto"):
        background.wait_for_workers()  # never two compiles at once
    check_device(device)
    dtype = parse_dtype(dtype) or default_dtype(device)
    if device is not None and device_map is not None:
        raise ValueError("give a device or a device_map, not both")
    quiet_transformers()
    if name.startswith((".", "/", "~")) and not os.path.exists(os.path.expanduser(name)):
        raise ValueError(f"model path {name!r} does not exist")
    try:
        if name in DEFAULT_NAMES:
            if device_map is not None:
                raise ValueError("device_map is for hub models; the embedded pair fits one device")
            model = load_default(name, device=device, dtype=dtype, compile=compile)
        else:
            extra = {"device_map": device_map} if device_map is not None else {}
            model = HFModel.from_pretrained(name, device=device, dtype=dtype, compile=compile, **extra)
    except (OSError, ValueError):
        raise
    except Exception as e:  # a corrupt weights file surfaces as a library-specific error
        first = " ".join(str(e).split())[:300]
        raise ValueError(f"could not load model {name!r}: {type(e).__name__}: {first}") from e
    if getattr(model, "auto_compile", False):
        background.settle(model, role)
    return model


def check_device(device: str | None) -> None:
    """A clear error for a device this machine does not have, before any model is read."""
    if device is None:
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a torch device (cpu, cuda, cuda:1, mps, ...)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: this machine has no CUDA device (torch {torch.__version__})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ValueError(f"device {device!r}: MPS is not available on this machine")


def quiet_transformers() -> None:
    """No weight-loading bars or warnings from transformers: they would drown the generated text."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_pair(
    target: str | None = None,
    draft: str | None = None,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict | None = None,
    compile: bool | str = "auto",
) -> ModelPair:
    """The embedded default pair, or any target and draft given as hub ids or local paths.

    Args:
        target: a default name (`DEFAULT_NAMES`), a hub id or a local path; None: the default target.
        draft: the same for the draft, or a folder holding a feature-level head (EAGLE-3, `multispec distill
            --kind eagle` or the speculators layout vLLM and SGLang read: `models.eagle`); None: the default draft
            with the default target, else no draft (use `ar`, `beam` or a copying drafter, or pass one).
        device: a torch device ("cpu", "cuda", "cuda:1"); None: the CPU.
        dtype: "float32", "bfloat16" or "float16", for both; None: bfloat16 where the hardware has fast
            bfloat16, else float32.
        device_map: spread a hub target too large for one device over several (accelerate's, e.g. "auto").
        compile: "auto": each model runs compiled where compiled steps pay here (a CPU with AVX512-BF16 or AMX,
            in bfloat16) and are already made on this machine; where they are not yet, it runs eagerly and a
            background process makes them for later runs (`models/hf/background.py`; MULTISPEC_COMPILE=eager
            turns this off). False: eager. True, "invariant" or "fast": compiled now, in this process (minutes per
            shape the first time on a machine). "invariant": the target's compiled steps are batch-invariant, so
            greedy speculative methods give greedy `ar`'s tokens; True: so are they where that costs no more on
            this machine; "fast": never (the draft's, which decide nothing, are compiled as usual).

    Returns:
        A `ModelPair` (`target`, `draft` or None, `description`: each model in words).

    Raises:
        ValueError: a device this machine lacks, a model that cannot be read, vocabularies that differ.
    """
    target_model = load_model(target, device, dtype=dtype, device_map=device_map, compile=compile)
    if draft is None and target not in (None, TARGET_NAME):
        draft_model = None
    elif draft is not None and is_eagle(draft):  # a feature-level head: drafts from the target's hidden states
        draft_model = load_eagle(draft, target_model)
    else:
        draft_compile = compile if compile in (False, "auto") else True
        draft_model = load_model(draft, device, default=DRAFT_NAME, dtype=dtype, compile=draft_compile, role="draft")
    if draft_model is not None:
        check_compatible(target_model, draft_model)
    describe = {m.name: describe_model(m) for m in (target_model, draft_model) if m is not None}
    return ModelPair(target_model, draft_model, describe)


def describe_model(model: LanguageModel) -> str:
    how = [str(getattr(model, "dtype", "")).replace("torch.", "")]
    if getattr(model, "compile", False):
        how.append(
            "compiled, batch-invariant"
            if getattr(getattr(model, "steps", None), "kernel", None) == "invariant"
            else "compiled"
        )
    elif getattr(model, "auto_compile", False) and background.waiting(model):
        how.append("eager until its compiled steps are made (in the background)")
    return DEFAULT_NAMES.get(model.name, model.name) + " - " + ", ".join(h for h in how if h)


_SAME_VOCAB: dict[tuple[int, int], tuple] = {}  # tokenizer pairs found to share one vocabulary


def check_compatible(target: LanguageModel, draft: LanguageModel) -> None:
    if target.vocab_size != draft.vocab_size:
        raise ValueError(
            f"draft and target vocabularies differ: target {target.name!r} has {target.vocab_size} tokens, "
            f"draft {draft.name!r} has {draft.vocab_size}; speculative methods need one shared tokenizer"
        )
    tt, dt = target.tokenizer, draft.tokenizer
    if tt is None or dt is None or tt is dt or (id(tt), id(dt)) in _SAME_VOCAB:
        return
    if tt.get_vocab() == dt.get_vocab():  # two 49k-entry dicts: ~50 ms, once per pair of tokenizers, not per call
        _SAME_VOCAB[(id(tt), id(dt))] = (tt, dt)  # holding them keeps the ids from being reused
    else:
        raise ValueError(
            f"draft and target tokenizers differ (target {target.name!r}: {len(tt)} tokens, "
            f"draft {draft.name!r}: {len(dt)} tokens, same size but different token ids)"
        )


def generate(
    target: LanguageModel,
    draft: LanguageModel | None,
    prompt: str | list[int],
    method: str | None = DEFAULT_METHOD,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = 0,
    chat: bool = True,
    on_tokens: Callable[[list[int]], bool | None] | None = None,
    score: bool = True,
    cancel: threading.Event | None = None,
    **method_params,
) -> Result:
    """Generate with `method`, on real models or the exact test models.

    Args:
        target: the model whose law the output follows (or approximates, for the lossy methods).
        draft: the draft model, or None (for `ar`, `beam` and the copying drafters `lookup`, `suffix`; `hybrid`
            uses the draft where one is given).
        prompt: text (the chat template is applied when the tokenizer has one and `chat` is true) or token
            ids [prompt tokens].
        method: a registered name ("ar", "beam", "sd", ...), optionally with parameters after a colon as on
            the command line ("sd:gamma=6"); keyword parameters override those. The default, `DEFAULT_METHOD`
            ("sd:gamma=auto,drafter=hybrid"), is the command line's; None means it too (as in `generate_batch`).
        max_new_tokens: at most this many new tokens (an end-of-sequence token ends the output sooner).
        temperature, top_k, top_p: the warp both models are sampled with (temperature 0: greedy).
        seed: the seed of every draw (same seed, same output); None: a fresh one.
        chat: apply the chat template to a text prompt.
        on_tokens: called with each piece of output as it is committed; a true return ends the output there
            (`stats["stopped"]` "stop": a stop string was met).
        score: add the output's mean log-probability and perplexity under the unwarped target to the stats
            (`mean_logprob`, `perplexity`): one more target forward over prompt and output, after the timed
            decoding.
        cancel: set from another thread, ends the output at the next iteration ("cancelled").
        **method_params: the method's parameters (`multispec methods` lists them).

    Returns:
        A `Result`: `token_ids` [new tokens], `text`, `stats` (`Stats`: counts and times) and `prompt_ids`.

    Raises:
        ValueError: a bad request (an unknown method or parameter, a value out of range, an empty prompt or
            one longer than the context, a draft with another vocabulary), naming the problem.
    """
    method = DEFAULT_METHOD if method is None else method
    method, given = parse_method(method) if isinstance(method, str) else (method, {})
    method_params = {**given, **method_params}
    spec, params, sampling = validate_request(method, max_new_tokens, temperature, top_k, top_p, method_params, seed)
    use = spec.draft_use(params)
    if use == "required" and draft is None:
        raise ValueError(
            f"method {method!r} needs a draft model; none was given (or use drafter=lookup, "
            "suffix or hybrid, which need none)"
            if "drafter" in spec.params
            else f"method {method!r} needs a draft model; none was given"
        )
    if use == "none":
        draft = None
    if draft is not None:
        check_compatible(target, draft)
    vocab = params.pop("draft_vocab", None)  # a property of the draft, set on the session before the run
    prompt_ids = _prompt_ids(target, prompt, chat)
    check_room(target, prompt_ids)
    device = target.device
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else int(torch.seed() % 2**63))

    background.switch_ready()  # a model whose steps a worker has made since runs compiled from here on
    session = Session(target, draft, prompt_ids, sampling, max_new_tokens, generator, on_tokens, cancel)
    if vocab is not None:
        session.reduce_draft(vocab)
        draft = session.draft_model  # its counters (compiles, fallbacks) are the reduced draft's
    seconds_before, compiles_before, captures_before = _compiling(target, draft)
    fallbacks_before = [len(getattr(m, "fallbacks", ())) for m in (target, draft)]
    t0 = time.perf_counter()
    if not session.done:
        with background.paused():  # no background compile beside decoding
            spec.run(session, **params)
    seconds = time.perf_counter() - t0
    seconds_after, compiles_after, captures_after = _compiling(target, draft)
    stats = session_stats(
        session,
        seconds,
        seconds_after - seconds_before,
        compiles_after - compiles_before,
        captures_after - captures_before,
    )
    # a compiled or captured step that failed during this call, which then ran its steps without (one line each)
    stats["fallbacks"] = [
        f"{m.name}: {why}"
        for m, n in zip((target, draft), fallbacks_before, strict=True)
        for why in getattr(m, "fallbacks", ())[n:]
    ]
    if score:
        stats["mean_logprob"] = mean_logprob(target, prompt_ids, session.new_tokens)
        stats["perplexity"] = perplexity([stats["mean_logprob"]])
    return Result(session.new_tokens, target.decode(session.new_tokens), stats, prompt_ids)


def validate_request(
    method: str, max_new_tokens, temperature, top_k, top_p, method_params: dict, seed=None, files: bool = True
):
    """Everything about a request that can be checked without a model: (method, parameters, sampling). Without
    `files`, parameters that could name a file take inline values only (see `Method.resolve`)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    spec = get_method(method)
    params = spec.resolve(method_params, files=files)
    sampling = Sampling(temperature, top_k, top_p)
    if sampling.greedy and not spec.greedy:
        raise ValueError(
            f"method {method!r} samples and has no temperature-0 form; use a temperature above 0"
            + (" (or beam, whose temperature 0 is beam search)" if method == "dsbd" else "")
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    return spec, params, sampling


def check_room(target: LanguageModel, prompt_ids: list[int], what: str = "the prompt") -> None:
    """Raise a ValueError naming `what` when the prompt leaves no room for an answer in the target's context."""
    room = target.max_length
    if room is not None and len(prompt_ids) >= room:
        raise ValueError(
            f"{what} has {len(prompt_ids)} tokens, which leaves no room in {target.name!r}'s context of {room}"
        )


def _prompt_ids(target: LanguageModel, prompt, chat: bool) -> list[int]:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        ids = target.encode(prompt, chat=chat)
    else:
        try:
            ids = [int(t) for t in prompt]
        except (TypeError, ValueError):
            raise ValueError("the prompt must be a string or a list of token ids") from None
        if not ids:
            raise ValueError("the prompt is empty")
        bad = [t for t in ids if not 0 <= t < target.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary of {target.vocab_size} tokens")
    if not ids:
        raise ValueError("the prompt is empty after tokenisation")
    return ids


def _compiling(*models) -> tuple[float, int, int]:
    """One-time seconds so far (compiling the models' forwards, capturing their CUDA graphs, measuring their
    cost curves for gamma=auto), graphs compiled and CUDA graphs captured."""
    from . import machine

    models = [m for m in models if m is not None]
    return (
        sum(getattr(m, "compile_seconds", 0.0) for m in models) + machine.calibration_seconds,
        sum(getattr(m, "compiles", 0) for m in models),
        sum(getattr(m, "graph_captures", 0) for m in models),
    )


def session_stats(s: Session, wall: float, one_time: float = 0.0, compiles: int = 0, captures: int = 0) -> Stats:
    """The call's `Stats` (see there for what each figure means)."""
    new = len(s.new_tokens)
    c = s.counters
    target_calls = s.target.calls
    draft_calls = s.draft.calls if s.draft is not None else 0
    seconds = max(wall - one_time, 1e-9)
    target_seconds = s.target.seconds - s.target.one_time
    draft_seconds = (s.draft.seconds - s.draft.one_time) if s.draft is not None else 0.0
    forward = target_seconds + draft_seconds
    stats = Stats(
        new_tokens=new,
        target_calls=target_calls,
        draft_calls=draft_calls,
        drafted=c["drafted"],
        draft_nodes=c["nodes"],
        accepted=c["accepted"],
        iterations=c["iterations"],
        rejections=c["rejections"],
        seconds=seconds,
        tokens_per_second=new / seconds if seconds > 0 else 0.0,
        wall_seconds=wall,
        one_time_seconds=one_time,
        target_seconds=target_seconds,
        prefill_seconds=s.target.prefill,
        draft_seconds=draft_seconds,
        draft_prefill_seconds=s.draft.prefill if s.draft is not None else 0.0,
        other_seconds=max(0.0, seconds - forward),
        compiles=compiles,
        graph_captures=captures,
        block_efficiency=new / target_calls if target_calls else 0.0,
        acceptance_rate=c["accepted"] / c["drafted"] if c["drafted"] else None,
        forward_seconds=forward,
        target_forwards={str(k): n for k, n in sorted(s.target.fed.items())},
        draft_forwards={str(k): n for k, n in sorted(s.draft.fed.items())} if s.draft is not None else {},
        stopped=s.stopped,
        accepted_length_histogram=list(s.accepted_lengths),
        accepted_per_position=list(s.position_accepts) + [0] * (len(s.position_tries) - len(s.position_accepts)),
        position_acceptance=[
            a / t for a, t in zip(s.position_accepts + [0] * len(s.position_tries), s.position_tries, strict=False)
        ],
    )
    if s.ranks:
        stats["rank_acceptance"] = {k: v.as_dict() for k, v in s.ranks.items()}
    for key, value in s.info.items():  # the method's own figures
        stats[key] = value
    return stats
