"""Compiled CPU steps kept on disk, so that only a machine's first use of a shape pays for compiling it.

A step (one shape: rows x new tokens, one kernel variant) is exported with `torch.export` and compiled ahead
of time by inductor (AOTInductor) into a package: a shared library holding the generated kernels and the
frozen, oneDNN-packed weights. Packages live in a folder beside the cost file, named by a key of the model's
architecture and weights, its dtype, the machine (CPU model, instruction-set flags, threads) and torch's
version, so a package is only ever loaded where it was made for. Loading one takes seconds where
compiling takes minutes.

torch.compile's own on-disk caches cannot do this: inductor's FX graph cache refuses graphs that hold packed
weights (they do not pickle), and the packed weights are what make a CPU step fast.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..machine import store_path

LONGEST = 1 << 20  # the largest key length and cache capacity a package accepts
SAMPLES = 4096  # values hashed per weight tensor (spread over it) for the weights' fingerprint


def enabled() -> bool:
    """Packages are kept unless MULTISPEC_KEEP_COMPILED=0 (a package holds a copy of the weights: a few
    hundred MB per shape for the default target, more for larger models)."""
    return os.environ.get("MULTISPEC_KEEP_COMPILED", "1") != "0"


LIMIT_VARIABLE = "MULTISPEC_COMPILED_LIMIT_GB"
DEFAULT_LIMIT_GB = 20.0


def limit_bytes() -> int:
    """How much disk the packages may take together (MULTISPEC_COMPILED_LIMIT_GB, default 20): past it, the
    least recently used ones are removed after a compile."""
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not text:
        return int(DEFAULT_LIMIT_GB * 1e9)
    try:
        gb = float(text)
    except ValueError:
        gb = -1.0
    if not gb >= 0 or gb == float("inf"):
        raise ValueError(
            f"{LIMIT_VARIABLE}={text!r}: give the gigabytes compiled steps may take on disk, a number >= 0"
        )
    return int(gb * 1e9)


def folder() -> Path:

    return store_path().with_name("compiled")


def weights_fingerprint(module: torch.nn.Module) -> str:
    """A hash of the module's configuration and of every weight's name, shape, dtype and a spread sample of
    its values: two checkpoints of one architecture (a fine-tune, a tiny model with another seed) differ. Where
    the checkpoint was loaded from is left out (the config's `_name_or_path`): a model moved, or the shipped draft
    in another environment's copy of the package, finds the steps made for it."""
    digest = hashlib.blake2b(digest_size=16)
    config = getattr(module, "config", None)
    if config is not None:
        fields = {k: v for k, v in config.to_dict().items() if k != "_name_or_path"}
        digest.update(json.dumps(fields, sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, tensor in (*module.named_parameters(), *module.named_buffers()):
            flat = tensor.detach().reshape(-1)
            step = max(1, flat.numel() // SAMPLES)
            sample = flat[::step][:SAMPLES].float().cpu().contiguous()
            digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()


def path_for(key: str, kind: str, shape: tuple[int, int]) -> Path:
    name = hashlib.blake2b(key.encode(), digest_size=12).hexdigest()
    return folder() / name / f"{kind}-{shape[0]}x{shape[1]}.pt2"


class Step(torch.nn.Module):
    """The exported module: the model's forward over a static cache (`HFModel.step`'s arguments)."""

    def __init__(self, model: torch.nn.Module, run: Callable):
        super().__init__()
        self.model = model  # registered, so that export sees the weights
        self._run = run

    def forward(self, ids, positions, masks, slots, keys, values):
        return self._run(ids, positions, masks, slots, keys, values)


def export(model: torch.nn.Module, run: Callable, args: tuple) -> torch.export.ExportedProgram:
    """`run(*args)` exported, with the key length (the masks' last dimension) and the cache capacity dynamic."""
    from torch.export import Dim

    ids, positions, masks, slots, keys, values = args
    width = ids.shape[1]
    key_length = Dim("key_length", min=width + 1, max=LONGEST)
    capacity = Dim("capacity", min=width + 1, max=LONGEST)  # at least the keys a step reads
    spec = (
        None,
        None,
        pytree.tree_map(lambda m: {m.dim() - 1: key_length}, masks),
        None,
        [{2: capacity}] * len(keys),
        [{2: capacity}] * len(values),
    )
    with torch.inference_mode(False), torch.no_grad():
        # the engine's tensors may be inference tensors, which export cannot trace writes into; only shapes
        # and types matter here
        examples = (
            ids.clone(),
            positions.clone(),
            pytree.tree_map(lambda m: m.contiguous().clone(), masks),
            slots.clone(),
            [torch.zeros_like(k) for k in keys],
            [torch.zeros_like(v) for v in values],
        )
        return torch.export.export(Step(model, run), examples, dynamic_shapes=spec, strict=False)


def build(path: Path, key: str, model: torch.nn.Module, run: Callable, args: tuple, kernels: dict) -> None:
    """Export `run(*args)` and compile it into a package at `path` (`compile_program`)."""
    compile_program(path, key, export(model, run, args), kernels)


def compile_program(path: Path, key: str, program: torch.export.ExportedProgram, kernels: dict) -> None:
    """Compile an exported step into a package at `path` with inductor options `kernels`; written under another
    name and renamed, so an interrupted compile leaves nothing half-made."""
    with torch.inference_mode(False), torch.no_grad():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".building-", suffix=".pt2")
        os.close(fd)
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=tmp, inductor_configs=dict(kernels))
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # as any other file written here (mkstemp made it private)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    (path.parent / "key.json").write_text(json.dumps({"key": key}))


def stale(key: str) -> bool:
    """Whether a package's key names a compiled step of another graph than this version of multispec compiles
    (`static.STEP_VERSION`, a field of the key): no process of this version loads it again."""
    from .static import STEP_VERSION

    fields = key.split("|")
    return any(f.startswith("compiled") for f in fields) and f"step={STEP_VERSION}" not in fields


def packages() -> list[dict]:
    """The packages on disk, most recently used first: path, model (the key's first field), key, bytes, used,
    stale (`stale`)."""
    found = []
    for path in folder().glob("*/*.pt2"):
        try:
            stat = path.stat()
        except OSError:  # removed meanwhile
            continue
        try:
            key = json.loads((path.parent / "key.json").read_text())["key"]
        except (OSError, ValueError, KeyError, TypeError):
            key = ""
        found.append(
            {
                "path": path,
                "model": key.split("|", 1)[0] or "?",
                "key": key,
                "bytes": stat.st_size,
                "used": stat.st_mtime,
                "stale": bool(key) and stale(key),
            }
        )
    return sorted(found, key=lambda p: -p["used"])


def remove(path: Path) -> None:
    """Remove a package, and its folder once it holds no other."""
    path.unlink(missing_ok=True)
    if path.parent.is_dir() and not any(path.parent.glob("*.pt2")):
        shutil.rmtree(path.parent, ignore_errors=True)


def prune_stale() -> list[dict]:
    """Remove the packages of another compiled graph than this version's (`stale`); returns those removed."""
    removed = [p for p in packages() if p["stale"]]
    for p in removed:
        remove(p["path"])
    return removed


def prune(keep: Path) -> list[dict]:
    """Remove the least recently used packages (never `keep`) until all of them fit the limit; returns those
    removed."""
    limit, found = limit_bytes(), packages()
    total = sum(p["bytes"] for p in found)
    removed = []
    for p in reversed(found):  # least recently used first
        if total <= limit:
            break
        if p["path"] == keep:
            continue
        remove(p["path"])
        total -= p["bytes"]
        removed.append(p)
    return removed


class Loaded:
    """A loaded package, called like the step. The call spec is read once (the stock wrapper parses it on
    every call); the inputs must be contiguous, as the examples were."""

    def __init__(self, path: Path):
        self.path = path
        self.loader = torch._inductor.aoti_load_package(str(path)).loader
        self.outputs = pytree.treespec_loads(self.loader.get_call_spec()[1])

    def __call__(self, *args) -> Any:
        flat = pytree.tree_leaves(args)
        for t in flat:
            if not t.is_contiguous():
                raise ValueError("a packaged step takes contiguous inputs")
        return pytree.tree_unflatten(self.loader.boxed_run(flat), self.outputs)


def load(path: Path) -> Loaded | None:
    """The package at `path`, or None where there is none or it does not load (it is then removed)."""
    if not path.exists():
        return None
    try:
        step = Loaded(path)
    except Exception:  # noqa: BLE001 - a damaged or foreign package is made again
        path.unlink(missing_ok=True)
        return None
    os.utime(path)  # its last use, for `prune`
    return step
