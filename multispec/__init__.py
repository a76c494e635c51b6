"""multispec: speculative decoding beyond single-token sampling, on one engine.

The public names are imported on first use, so that `multispec --help` answers without loading torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Batcher": "batching",
    "ModelPair": "api",
    "Result": "result",
    "Stats": "result",
    "generate": "api",
    "generate_batch": "batching",
    "load_model": "api",
    "load_pair": "api",
    "METHODS": "decoding",
    "LanguageModel": "models.base",
    "HFModel": "models.hf",
    "MarkovLM": "models.markov",
    "Sampling": "warp",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'multispec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
