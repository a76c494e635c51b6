"""The shared decoding engine.

Every method is the same four steps: propose (the draft builds a chain, tree or forest and keeps the
distributions it sampled from), score (the target scores all proposed nodes in one forward over its
KV cache), verify (a pure function from `multispec.verify`), commit (both caches keep the accepted
nodes and drop the rest).

`ModelRunner` ties one model's KV cache to the shared list of committed tokens. Its cache always holds
a prefix of the committed tokens, possibly followed by *tentative* entries (proposed nodes not yet
verified). Invariant after each commit: the last committed token is not cached, so the next forward
always starts with at least one committed token and yields the distribution that follows it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .models.base import LanguageModel
from .trees import TokenTree
from .warp import Sampling


class ModelRunner:
    def __init__(self, model: LanguageModel):
        self.model = model
        self.cache = model.new_cache()
        self.committed = 0  # committed tokens held in the cache
        self.tentative = 0  # proposed entries after them
        self.calls = 0
        self.seconds = 0.0

    def feed(
        self,
        tokens: list[int],
        extra: torch.Tensor | None = None,
        tree: TokenTree | None = None,
        nodes: slice | None = None,
    ) -> torch.Tensor:
        """One forward over the uncached committed tokens, then `extra` proposed tokens.

        Without `tree`, the extras continue the chain of tentative entries. With `tree`, the extras are
        the tree's nodes `nodes` (default: all), and every earlier tentative entry must be the tree's
        nodes before them: each node then sees the committed tokens, its ancestors and itself.
        Returns logits [k, V]: one row after the last committed token if any were pending, then one per
        extra token.
        """
        pending = tokens[self.committed :]
        if pending and self.tentative:
            raise RuntimeError("committed tokens cannot be fed after tentative entries; commit first")
        n_extra = 0 if extra is None else extra.shape[-1]
        device = self.model.device
        parts = [torch.tensor(pending, dtype=torch.long, device=device)] if pending else []
        if n_extra:
            parts.append(extra.to(device=device, dtype=torch.long).reshape(-1))
        inputs = torch.cat(parts)[None]
        past = self.committed + self.tentative
        positions = torch.arange(past, past + inputs.shape[1], device=device)
        mask = None
        if tree is not None and n_extra:
            nodes = nodes or slice(0, tree.size)
            start = nodes.start or 0
            if start != self.tentative:
                raise RuntimeError(f"tree nodes from {start} fed with {self.tentative} tentative entries cached")
            if not tree.is_chain:
                committed_len = len(tokens)
                positions[len(pending) :] = committed_len - 1 + tree.depth[nodes].to(device)
                mask = _tree_mask(len(pending), self.committed, tree.visible[nodes, : nodes.stop].to(device))
        t0 = time.perf_counter()
        logits = self.model.forward(
            self.cache, inputs, positions[None], mask, logits_to_keep=n_extra + (1 if pending else 0)
        )
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        self.committed += len(pending)
        self.tentative += n_extra
        return logits[0]

    def forward_rows(self, tokens: torch.Tensor, positions=None, mask=None) -> torch.Tensor:
        """A batched forward of [B, n] tokens on the cache rows as they stand (beams); logits [B, n, V].
        The caller owns the rows' bookkeeping."""
        t0 = time.perf_counter()
        logits = self.model.forward(self.cache, tokens.to(self.model.device), positions, mask)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return logits

    def commit(self, new_length: int, kept: list[int]) -> None:
        """The committed sequence is now `new_length` tokens long; `kept` (tentative offsets, in order)
        are the accepted entries, which become committed. Everything else tentative is dropped."""
        # only entries actually fed can be kept (a chain's last draft never is), and the last committed
        # token stays uncached
        kept = [k for k in kept if k < self.tentative][: max(0, new_length - 1 - self.committed)]
        if kept == list(range(len(kept))):
            self.model.crop(self.cache, self.committed + len(kept))
        else:
            idx = list(range(self.committed)) + [self.committed + k for k in kept]
            self.model.keep_positions(self.cache, torch.tensor(idx, dtype=torch.long))
        self.committed += len(kept)
        self.tentative = 0


def _tree_mask(n_pending: int, n_cached: int, visible: torch.Tensor) -> torch.Tensor:
    """Bool mask [1, n_pending + E, n_cached + n_pending + T] for pending committed rows (causal) followed
    by E tree rows that see every committed token and `visible` ([E, T]) among the tentative entries."""
    n_extra, n_tent = visible.shape
    committed = n_cached + n_pending
    mask = torch.zeros(n_pending + n_extra, committed + n_tent, dtype=torch.bool, device=visible.device)
    if n_pending:
        mask[:n_pending, :committed] = torch.ones(n_pending, committed, dtype=torch.bool).tril(n_cached)
    mask[n_pending:, :committed] = True
    mask[n_pending:, committed:] = visible
    return mask[None]


class Session:
    """The state of one generation: committed tokens, both runners, sampling, budget and counters."""

    def __init__(
        self,
        target: LanguageModel,
        draft: LanguageModel | None,
        prompt: list[int],
        sampling: Sampling,
        max_new_tokens: int,
        generator: torch.Generator,
        on_tokens: Callable[[list[int]], None] | None = None,
    ):
        self.target_model, self.draft_model = target, draft
        self.target = ModelRunner(target)
        self.draft = ModelRunner(draft) if draft is not None else None
        self.tokens = list(prompt)
        self.prompt_length = len(prompt)
        self.sampling = sampling
        self.max_new_tokens = max_new_tokens
        self.generator = generator
        self.on_tokens = on_tokens
        self.eos = target.eos_token_id
        self.stopped: str | None = "length" if max_new_tokens == 0 else None
        self.counters = {"iterations": 0, "drafted": 0, "accepted": 0, "rejections": 0}
        limits = [m.max_length for m in (target, draft) if m is not None and m.max_length is not None]
        self.max_length = min(limits) if limits else None

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    @property
    def done(self) -> bool:
        return self.stopped is not None

    def budget(self) -> int:
        """How many more tokens may still be committed (length and context)."""
        left = self.max_new_tokens - len(self.new_tokens)
        if self.max_length is not None:
            left = min(left, self.max_length - len(self.tokens))
        return left

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        if self.sampling.greedy:
            return probs.argmax(-1)
        return torch.multinomial(probs, 1, generator=self.generator)[..., 0]

    def commit(self, tokens: list[int], drafted: int = 0, accepted: int = 0, rejected: bool = False) -> None:
        """Append tokens, cutting at EOS and at the budget; count one iteration (and its rejection)."""
        tokens = tokens[: self.budget()]
        if self.eos is not None and self.eos in tokens:
            tokens = tokens[: tokens.index(self.eos) + 1]
            self.stopped = "eos"
        self.tokens.extend(tokens)
        self.counters["iterations"] += 1
        self.counters["drafted"] += drafted
        self.counters["accepted"] += accepted
        self.counters["rejections"] += int(rejected)
        if self.stopped is None and self.budget() <= 0:
            self.stopped = "length" if len(self.new_tokens) >= self.max_new_tokens else "context"
        if self.on_tokens is not None and tokens:
            self.on_tokens(tokens)
