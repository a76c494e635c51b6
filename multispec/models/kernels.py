"""CPU kernel choice for the few rows of a decoding step.

With weights streamed from memory, MKL computes `weight @ x.T` about twice as fast as `x @ weight.T` for
1 to 11 rows, and its kernels for 1, 3 and 7 columns are slower than for 2, 4 and 8. `FewRowsLinear` takes
the first form (padding those row counts) and keeps the parameters and state dict of `nn.Linear`; a
speculative step scores 2 to 11 positions, and this is what makes it cost about as much as a plain step on
a CPU. Measurements: NOTES.md and benchmarks/few_rows_ab.py.
"""

from __future__ import annotations

import contextlib

import torch

FEW_ROWS = 11  # up to this many rows `FewRowsLinear` takes the transposed product (measured)
# MKL's kernels for 1, 3 and 7 columns are slower than for 2, 4 and 8 here: those get duplicate rows (measured)
PAD_ROWS = {1: 2, 3: 4, 7: 8}


class FewRowsLinear(torch.nn.Linear):
    """`nn.Linear` that computes a product of few rows as `weight @ x.T` (see the module note)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows > FEW_ROWS or rows == 0:
            return super().forward(x)
        flat = x.reshape(rows, x.shape[-1])
        padded = PAD_ROWS.get(rows, rows)
        if padded > rows:
            flat = torch.cat([flat, flat[: padded - rows]])
        out = (self.weight @ flat.T).T[:rows]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).contiguous()


def use_few_rows_linears(model: torch.nn.Module) -> int:
    """Switch the plain float32 `nn.Linear` modules of `model` to `FewRowsLinear` (same parameters and
    state dict; subclasses such as quantised linears are left alone). Returns how many were switched."""
    n = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32:
            module.__class__ = FewRowsLinear
            n += 1
    return n


@contextlib.contextmanager
def stock_linears(*models: torch.nn.Module):
    """Inside the block the models' `FewRowsLinear` modules are plain `nn.Linear` again: transformers'
    model as it ships (the `hf` baselines of the bench)."""
    switched = [m for model in models if model is not None for m in model.modules() if type(m) is FewRowsLinear]
    for m in switched:
        m.__class__ = torch.nn.Linear
    try:
        yield
    finally:
        for m in switched:
            m.__class__ = FewRowsLinear
