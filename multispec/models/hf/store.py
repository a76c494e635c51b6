"""This machine's kernel store for compiled steps: the variant each shape's race kept, the outcome of the
batch-invariance checks and of the batch-invariant race, keyed by model, dtype, device, threads and instruction
sets (`kernel_key`), and for what depends on the weights, by the weights too (`CompiledSteps.package_key`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...machine import describe_device, kernel_store_path, read_store, write_store_entry
from .kernels import COMPILED_TOKENS, CONCAT, INVARIANT_DPBF16, VARIANTS

if TYPE_CHECKING:
    from .model import HFModel


def kernel_key(model: HFModel) -> str:
    from ..cost import cost_key

    return f"{cost_key(model, kernels=False)}|{describe_device(model.device)}"


def _kernel_store():
    return kernel_store_path()


def stored_entry(key: str, name: str) -> dict | None:
    """Entry `name` under `key` in this machine's kernel store, if an earlier process wrote one."""
    choices = read_store(_kernel_store()).get(key)
    entry = choices.get(name) if isinstance(choices, dict) else None
    return entry if isinstance(entry, dict) else None


def store_entry(key: str, name: str, entry: dict) -> None:
    store = _kernel_store()
    choices = read_store(store).get(key)
    choices = choices if isinstance(choices, dict) else {}
    choices[name] = entry
    write_store_entry(store, key, choices)


def stored_choice(model, shape) -> dict | None:
    """The kernel choice an earlier process on this machine stored for this shape (kernel, step_ms, ...), if any
    names a variant this version has."""
    entry = stored_entry(kernel_key(model), f"{shape[0]}x{shape[1]}")
    return entry if entry is not None and entry.get("kernel") in (*VARIANTS, INVARIANT_DPBF16) else None


def ends(shape: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two shapes whose races a shape of the same rows may follow: one new token and `COMPILED_TOKENS`."""
    return (shape[0], 1), (shape[0], COMPILED_TOKENS)


def candidates(model, shape) -> list[str] | None:
    """The variants a bucket between one new token and `COMPILED_TOKENS` races on this machine: those the two ends'
    races kept (one or two); None for an end, or where an end is not raced yet (every variant races). A race
    compiles the whole model once per variant (a minute or more per shape), and the ends bound the work a step's
    products do per weight read: a variant that lost at both ends did not win between them by more than noise on
    the machines measured, though a kept variant's `CONCAT` form did (docs/decisions.md)."""
    if shape in ends(shape):
        return None
    raced = [stored_choice(model, end) for end in ends(shape)]
    if any(e is None for e in raced):
        return None
    return list(dict.fromkeys(e["kernel"] for e in raced))


def choice(model, shape) -> dict | None:
    """The variant `shape`'s compiled step runs on this machine: its own race's (`stored_choice`), else the one
    variant both ends' races kept, in its `CONCAT` form (an entry with `"from"`, not raced itself: `candidates`);
    None where it must be raced."""
    entry = stored_choice(model, shape)
    if entry is not None:
        return entry
    among = candidates(model, shape)
    if among is None or len(among) > 1 or not among[0].endswith(CONCAT):
        return None  # (a variant without CONCAT is raced against its CONCAT form: one may win only between the ends)
    return {"kernel": among[0], "from": [f"{r}x{w}" for r, w in ends(shape)]}


def tried(entry: dict) -> set[str]:
    """The variants a stored kernel choice timed, or found not to compile, in any race."""
    return {*entry.get("step_ms", {}), *entry.get("before_ms", {}), *entry.get("failed", [])}


def stored_check(model, width: int) -> int | None:
    """`CompiledSteps.check_invariance`'s outcome for this bucket from an earlier process on this machine, if any
    (keyed with the weights: a check is of one model's step)."""
    differing = (stored_entry(model.steps.package_key(), f"{model.steps.invariant_kind()} 1x{width}") or {}).get(
        "differing"
    )
    return differing if isinstance(differing, int) else None


def store_check(model, width: int, differing: int) -> None:
    store_entry(
        model.steps.package_key(), f"{model.steps.invariant_kind()} 1x{width}", {"differing": differing, "of": width}
    )


def store_kernel(
    model,
    shape,
    kind: str,
    seconds: dict[str, float],
    failed: list[str],
    before: dict | None = None,
    among: list[str] | None = None,
) -> None:
    """The kept variant, the step times of the race (ms) and the variants that failed to compile; `before`: the
    choice an earlier process stored, which this race redid with variants it lacked (its times: `before_ms`);
    `among`: the ends' variants a bucket between them raced alone (`candidates`)."""
    entry = {"kernel": kind, "step_ms": {k: round(1e3 * v, 3) for k, v in seconds.items()}}
    if among is not None:
        entry["among"] = among
    if failed or before:
        entry["failed"] = sorted({*failed, *(before or {}).get("failed", [])})
    if before:
        entry["before_ms"] = {**before.get("before_ms", {}), **before.get("step_ms", {})}
    store_entry(kernel_key(model), f"{shape[0]}x{shape[1]}", entry)
