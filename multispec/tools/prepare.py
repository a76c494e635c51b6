"""`multispec compile`: make a model's compiled steps on this machine now, every bucket of new tokens, as its first
compiled run would (kernel races, packages, the batch-invariance checks), so that later processes load them. The
background worker that `compile="auto"` starts runs this (`models/hf/background.py`)."""

from __future__ import annotations

import time

import torch

from ..console import note
from ..models.hf import background
from ..models.hf.kernels import INVARIANCE_PROMPT


@torch.inference_mode()
def prepare_model(model, role: str, status=None, bar=None) -> dict:
    """Compile and package every bucket's step of `model` (an `HFModel` loaded with compile=True) for `role`
    ("target": batch-invariant steps where they cost no more; "draft": the fast ones). `status`: a worker's status
    file, kept up to date; `bar`: a tqdm bar advanced once per bucket. Returns the shapes made and the time."""
    if not getattr(model, "compile", False):
        raise ValueError(f"{model.name} is not compiled here (a dynamic cache, or loaded without compile)")
    t0, before = time.perf_counter(), model.compiles
    invariant = role == "target"
    if invariant:
        model.prepare()  # the choice between batch-invariant and fast steps (a race, once per machine)
    generator = torch.Generator().manual_seed(0)
    for done, width in enumerate(background.BUCKETS):
        what = f"{model.name} ({role}), {width} new token{'s' if width > 1 else ''}"
        if status is not None:
            background.write_status(status, state="compiling", done=done, shape=what)
        if bar is not None:
            bar.set_description(f"compiling {what}")
        ids = torch.randint(model.vocab_size, (1, INVARIANCE_PROMPT + width), generator=generator)
        cache = model.new_cache()
        model.forward(cache, ids[:, :INVARIANCE_PROMPT], logits_to_keep=1)  # a prompt runs eagerly
        model.forward(cache, ids[:, INVARIANCE_PROMPT:], batch_invariant=invariant)
        if bar is not None:
            bar.update(1)
    if status is not None:
        background.write_status(status, state="done", done=len(background.BUCKETS), shape="")
    return {
        "model": model.name,
        "role": role,
        "compiled": model.compiles - before,
        "seconds": time.perf_counter() - t0,
        "missing": background.missing(model, role),
    }


def run(models: list[tuple[object, str]], in_background: bool = False) -> list[dict]:
    """Prepare each (model, role) in turn (the caller holds this machine's compile lock: `background.compile_lock`).
    In the background: the progress goes to the worker's status file, not to a bar."""
    from tqdm import tqdm

    results = []
    for model, role in models:
        status = background.status_path(background.worker_source(model), role, model.dtype, model.device)
        if in_background:
            try:
                results.append(prepare_model(model, role, status=status))
            except BaseException as e:
                background.write_status(status, state="failed", error=f"{type(e).__name__}: {e}"[:500])
                raise
            if results[-1]["missing"]:  # (a model that does not export): later runs do not start it again
                error = "still missing after compiling: " + ", ".join(results[-1]["missing"])
                background.write_status(status, state="failed", error=error)
            continue
        with tqdm(total=len(background.BUCKETS), unit="shape", leave=True) as bar:
            results.append(prepare_model(model, role, bar=bar))
        left = results[-1]["missing"]
        if not left:
            status.unlink(missing_ok=True)  # a failed background compile of it is over
        note(
            f"multispec: {model.name} ({role}): {results[-1]['compiled']} graph(s) compiled in "
            f"{results[-1]['seconds']:.0f} s" + (f"; still missing: {', '.join(left)}" if left else "; ready")
        )
    return results
