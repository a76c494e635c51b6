"""CUDA graphs of a model's steps: on one CUDA device, a step of up to `COMPILED_TOKENS` new tokens (compiled where
the model is) is captured once per shape and cache buffers, then replayed, its kernels launched without Python in
between."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from .kernels import GRAPH_WARMUP, GRAPHS_KEPT

if TYPE_CHECKING:
    from .model import HFModel


class CapturedSteps:
    """The captured steps of one model (`HFModel.graphed`, used where `HFModel.graphs` is on)."""

    def __init__(self, hf: HFModel):
        self.hf = hf
        self._graphs: dict[tuple, Any] = {}  # least recently used first
        self._graph_pool = None

    def run(self, ids, positions, masks, slots, cache):
        """The step (compiled when `compile`, else eager) as a CUDA graph, captured on first use for these
        shapes and these cache buffers (a graph reads and writes the buffers it was captured with: a new cache
        at the same addresses, as the caching allocator often gives, reuses it), then replayed. Returns the
        graph's own logits [rows, width, vocab]."""
        named = sorted(masks.items()) if isinstance(masks, dict) else [(None, masks)]
        buffers = (*cache.key_buffers, *cache.value_buffers)
        key = (
            tuple(ids.shape),
            tuple((k, tuple(m.shape)) for k, m in named),
            tuple(b.data_ptr() for b in buffers),
            tuple(tuple(b.shape) for b in buffers),
        )
        entry = self._graphs.pop(key, None)
        if entry is None:
            entry = self._capture(ids, positions, named, slots, cache)
        self._graphs[key] = entry  # most recently used last
        while len(self._graphs) > GRAPHS_KEPT:
            self._graphs.pop(next(iter(self._graphs)))
        inputs, output, graph = entry
        for held, given in zip(inputs, (ids, positions, *(m for _, m in named), slots), strict=True):
            held.copy_(given)
        graph.replay()
        return output

    def _capture(self, ids, positions, named, slots, cache):
        t0 = time.perf_counter()
        compiled_before = self.hf.compile_seconds
        inputs = [
            torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)
            for t in (ids, positions, *(m for _, m in named), slots)
        ]

        def step():
            ids, positions, *masks, slots = inputs
            masks = masks[0] if named[0][0] is None else {k: m for (k, _), m in zip(named, masks, strict=True)}
            if self.hf.compile:
                return self.hf.steps.run(ids, positions, masks, slots, cache)
            return self.hf.step(ids, positions, masks, slots, cache.keys, cache.values)

        # the warm-up runs write the same entries at the same slots as the replay will
        side = torch.cuda.Stream(self.hf.device)
        side.wait_stream(torch.cuda.current_stream(self.hf.device))
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP):
                step()
        torch.cuda.current_stream(self.hf.device).wait_stream(side)
        if self._graph_pool is None:
            # one memory pool for all of a model's graphs: they never run at once, and each replay's output is
            # copied out before the next
            self._graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            output = step()
        self.hf.graph_captures += 1
        # one-time cost, like a compile (a compile during the warm-up is counted once)
        self.hf.compile_seconds = compiled_before + time.perf_counter() - t0
        return inputs, output, graph
