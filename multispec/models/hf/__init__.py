"""Any transformers causal LM behind the `LanguageModel` interface: `HFModel`.

The KV cache is static (`models/static.py`): preallocated buffers written by our attention function, so
a rollback is a length change and a tree commit moves only the accepted entries. Every forward passes
explicit position ids and an additive 4-D mask ([B, 1, n, K], 0 where allowed), built here from the
engine's boolean mask; sliding windows are applied in that mask. With `compile=True` the forward is
compiled by torch inductor once per (rows, bucket of new tokens): new tokens are padded to 1, 2, 4, 8, ...
up to `COMPILED_TOKENS`; longer feeds and the prompt run eagerly. On a CPU the compile freezes the weights, and
each shape's graph is compiled in each of `KERNELS`, the faster of them again with `CONCAT` (products that read
the same input made one), and the one whose whole step ran fastest here is kept (the choice is stored per machine,
model, dtype and thread count), so no kernel choice made on another host is baked in; the kept step is compiled
ahead of time into a package on disk (`packaged.py`), which later processes load. A family whose attention
layers do not go through transformers' attention interface keeps transformers' `DynamicCache`, with one line
saying so.

The parts, each in its own file: `model.py` (`HFModel`: loading, the cache operations, a step's inputs and the
`forward` that dispatches it), `compiled.py` (`CompiledSteps`: compiled steps, kernel races and the batch-invariant
checks), `graphs.py` (CUDA graphs), `dynamic.py` (transformers' `DynamicCache`), `kernels.py` (the kernel
variants, constants and pure functions) and `store.py` (this machine's kernel choices). The static cache is
`models/static.py`, the packages on disk `models/packaged.py`, our CPU kernel `models/dpbf16.py`.
"""

from .compiled import CompiledSteps
from .kernels import (
    COMPILED_TOKENS,
    CONCAT,
    DPBF16,
    EXACT_CHOICE,
    FAST,
    INVARIANT,
    INVARIANT_DPBF16,
    KERNELS,
    RACED,
    VARIANTS,
    default_dtype,
    has_fast_bfloat16,
    invariant_rows,
    kernel_options,
)
from .model import HFModel
from .store import kernel_key, stored_choice

__all__ = [
    "COMPILED_TOKENS",
    "CONCAT",
    "DPBF16",
    "EXACT_CHOICE",
    "FAST",
    "INVARIANT",
    "INVARIANT_DPBF16",
    "KERNELS",
    "RACED",
    "VARIANTS",
    "CompiledSteps",
    "HFModel",
    "default_dtype",
    "has_fast_bfloat16",
    "invariant_rows",
    "kernel_key",
    "kernel_options",
    "stored_choice",
]
