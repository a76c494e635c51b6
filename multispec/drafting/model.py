"""Drafters that run the draft model: a sampled chain (`DraftChain`) or a tree of a k-config (`DraftTree`).

Each owns the draft model's cache through its `ModelRunner`: it feeds the committed tokens the cache lacks and
its proposed nodes, and on `accept` keeps the accepted nodes it fed and drops the rest. The last draft of a
chain and the deepest level of a tree are never fed (nothing reads their draft rows); an accepted one is fed
with the next proposal, as a committed token.
"""

from __future__ import annotations

from functools import partial

import torch

from ..engine import Entries, ModelRunner
from ..trees import Shape, TokenTree, shape_depth
from ..verify.verdict import Verdict
from ..warp import LazyRows, argmax, categorical, largest, one_hot, sequential_draws
from .base import Drafter, Proposal, Setup


class ModelDrafter(Drafter):
    """A drafter that runs the draft model through `runner`, which nothing else feeds or commits."""

    name = "model"

    def __init__(self, runner: ModelRunner, setup: Setup):
        self.runner, self.setup = runner, setup
        self._pending: tuple[int, list[int | None]] | None = None  # (context length, each node's cache entry)
        # a feature-level draft fed its drafts its own features: the accepted ones are fed again, with the
        # target's, rather than kept (`models.eagle`)
        self.refeeds = bool(getattr(runner.model, "reads_target_features", False))

    def _start(self, context: list[int]) -> None:
        """Drop tentative entries a proposal left without a verdict, so the cache holds a prefix of `context`."""
        if self.runner.tentative:
            self.runner.commit(len(context))
        self._pending = None

    def _waits(self, context: list[int]) -> bool:
        """Whether the draft must wait for the target before drafting (a feature-level draft whose features of the
        committed tokens the target has not computed yet: the first iteration)."""
        waits = getattr(self.runner.model, "waits_for_target", None)
        return waits is not None and waits(self.runner.cache, len(context))

    def _proposed(self, context: list[int], entries: list[int | None]) -> None:
        """Remember, for `accept`, each proposed node's tentative entry in the cache (None: not fed)."""
        self._pending = (len(context), entries)

    def accept(self, verdict: Verdict) -> None:
        if self._pending is None:
            return
        length, entries = self._pending
        self._pending = None
        kept = []
        for node in [] if self.refeeds else verdict.accepted:
            entry = entries[node] if node < len(entries) else None
            if entry is None or entry >= self.runner.tentative:
                break
            kept.append(entry)
        self.runner.commit(length + len(verdict.new_tokens), [kept])


class DraftChain(ModelDrafter):
    """The draft model samples a chain, one draft forward per token; with `confidence` the chain ends after
    the first token whose probability under the draft's plain softmax (not the warped one, which is
    one-hot when greedy) is below it. With `fallback` (BiLD's fallback threshold) it ends after a token drawn
    from a distribution whose largest probability is below it: the warped draft's, or its plain softmax
    when greedy. The stop is decided by the draft alone from tokens already drawn, so verification stays
    exact."""

    def __init__(self, runner: ModelRunner, setup: Setup, confidence: float = 0.0, fallback: float = 0.0):
        super().__init__(runner, setup)
        self.confidence, self.fallback = confidence, fallback

    def propose(self, context: list[int], shape: tuple[int, ...]) -> Proposal:
        g = len(shape)
        self._start(context)
        if g == 0 or self._waits(context):
            return self.setup.empty()
        sampling = self.setup.sampling
        probs, tokens = [], []
        logits = self.runner.feed([context])[0]
        for i in range(g):
            if sampling.greedy:  # one-hot rows, made only if a rule reads them
                q, token = None, argmax(logits[-1])
            else:
                q, token = sampling.probs_and_token(logits[-1], self.setup.generator)
                probs.append(q)
            tokens.append(token)
            if self.confidence > 0 and torch.softmax(logits[-1].float(), -1)[token] < self.confidence:
                break
            if self.fallback > 0 and self._peak(q, logits[-1]) < self.fallback:
                break
            if i + 1 < g:  # the last draft is never fed to the draft model
                logits = self.runner.feed([context], Entries.chain(token.reshape(1)))[0]
        self._proposed(context, list(range(len(tokens))))
        device = self.setup.device
        drafted = torch.stack(tokens).to(device)
        rows = (
            partial(one_hot, drafted, logits[-1])
            if sampling.greedy
            else LazyRows(len(probs), lambda i: probs[i].to(device))
        )
        return Proposal(TokenTree.chain(len(tokens)), drafted, rows)

    def _peak(self, q: torch.Tensor, logits: torch.Tensor) -> float:
        return float((torch.softmax(logits.float(), -1) if self.setup.sampling.greedy else q).max())


class DraftTree(ModelDrafter):
    """The draft model expands a tree level by level, one draft forward per level (MCSD §3.8): every node gets
    its children (k_{d+1} each for a k-config; any number for a `TokenTree` in breadth-first layout) drawn from
    the draft's warped distribution after its path, i.i.d. (`replacement`) or one after another without
    replacement, kept in draw order. At temperature 0 the children are the draft's top-k tokens, best first,
    whatever `replacement` says (i.i.d. argmax draws would all be the same token, which is plain speculative
    decoding, MCSD §4.5); they are verified against the softmax of those k logits (MCSD §3.6), which with a
    one-hot target accepts the target's argmax. Every node of a level but the deepest is fed, leaves
    included: the runner's entries follow the node order."""

    def __init__(self, runner: ModelRunner, setup: Setup, replacement: bool = False):
        super().__init__(runner, setup)
        self.replacement = replacement
        self._trees: dict[tuple[int, ...], TokenTree] = {}

    def tree(self, shape: Shape) -> TokenTree:
        if isinstance(shape, TokenTree):
            return shape
        if shape not in self._trees:
            self._trees[shape] = TokenTree.from_branching(shape)
        return self._trees[shape]

    def propose(self, context: list[int], shape: Shape) -> Proposal:
        self._start(context)
        tree = self.tree(shape) if shape_depth(shape) and not self._waits(context) else None
        if tree is None or tree.size == 0:
            return self.setup.empty()
        logits = self.runner.feed([context])[0, -1:]  # [1, V]: the root
        greedy = self.setup.sampling.greedy
        vocab = logits.shape[-1]
        rows, tokens, live = [], [], []
        parent_live = torch.ones(1, dtype=torch.bool, device=logits.device)
        for d in range(1, tree.max_depth + 1):
            # k draws per node of the level above; `index` keeps each node's own number of them (host-made
            # once per tree: no mask built and no device sync per level)
            k, index = tree.draws(d, logits.device)
            if greedy:  # the top-k rows are made only if a rule reads them (the greedy walk does not)
                children, alive, top, weights = _top(logits, k)
                rows.append((top, weights))
            else:
                children, alive, stored = sample_children(self.setup, logits, k, self.replacement)
                rows.append(stored)
            flat, parent_live = children.reshape(-1), (alive & parent_live[:, None]).reshape(-1)  # parent by parent
            if index is not None:
                flat, parent_live = flat[index], parent_live[index]
            level = tree.level(d)
            tokens.append(flat)
            live.append(parent_live)
            if d < tree.max_depth:  # the deepest level is never fed to the draft model
                logits = self.runner.feed([context], Entries.tree(tree, flat, level))[0, -flat.numel() :]
        self._proposed(context, list(range(tree.size)))
        live_all = torch.cat(live)
        device = self.setup.device
        draft_rows = partial(_top_rows, rows, vocab, device) if greedy else torch.cat(rows).to(device)
        return Proposal(
            tree, torch.cat(tokens).to(device), draft_rows, None if bool(live_all.all()) else live_all.to(device)
        )


def sample_children(setup: Setup, logits: torch.Tensor, k: int, replacement: bool):
    """k children for each of n nodes from their draft logits [n, V]: the session's sampling, or the top-k
    at temperature 0. Returns (tokens [n, k], live [n, k] bool, the draft rows to verify against [n, V])."""
    if setup.sampling.greedy:
        return top_children(logits, k)
    probs = setup.sampling.probs(logits)
    return (*draw_children(probs, k, replacement, setup.generator), probs)


def draw_children(probs: torch.Tensor, k: int, replacement: bool, generator: torch.Generator | None = None):
    """k children per row of probs [n, V]: i.i.d., or one after another without replacement in draw order.

    Returns (tokens [n, k], live [n, k] bool). Without replacement from a row whose support is smaller than
    k, the slots past the support are padding (a copy of the first child, live False): MCSD §8.11(b),
    exact because Algorithm 2 is exact for any number of candidates up to the support.
    """
    if replacement:
        tokens = categorical(probs, generator, samples=k)
        return tokens, torch.ones_like(tokens, dtype=torch.bool)
    tokens, live = sequential_draws(probs, k, generator)
    return _pad(torch.where(live, tokens, tokens[:, :1]), live, k)


def top_children(logits: torch.Tensor, k: int):
    """Temperature 0: the k best tokens per row, best first, and the softmax of their logits as the draft
    row (MCSD §3.6). Returns (tokens [n, k], live [n, k], rows [n, V])."""
    tokens, live, top, weights = _top(logits, k)
    return tokens, live, _top_rows([(top, weights)], logits.shape[-1], logits.device)


def _top(logits: torch.Tensor, k: int):
    """(tokens [n, k], live [n, k], the top indices [n, m] and their softmax [n, m]), m = min(k, V)."""
    values, indices = largest(logits, min(k, logits.shape[-1]))
    return (*_pad(indices, torch.ones_like(indices, dtype=torch.bool), k), indices, torch.softmax(values.float(), -1))


def _top_rows(levels: list[tuple[torch.Tensor, torch.Tensor]], vocab: int, device) -> torch.Tensor:
    """Draft rows [R, V] of top-k children: per level, its rows' top indices [n, m] weighted by [n, m]."""
    rows = torch.zeros(sum(top.shape[0] for top, _ in levels), vocab, dtype=torch.float32, device=device)
    start = 0
    for top, weights in levels:
        rows[start : start + top.shape[0]].scatter_(-1, top.to(device), weights.to(device))
        start += top.shape[0]
    return rows


def _pad(tokens: torch.Tensor, live: torch.Tensor, k: int):
    """Pad [n, m] to k columns with dead copies of the first child (k above the vocabulary)."""
    n, m = tokens.shape
    if m == k:
        return tokens, live
    return (
        torch.cat([tokens, tokens[:, :1].expand(n, k - m)], 1),
        torch.cat([live, torch.zeros(n, k - m, dtype=torch.bool, device=live.device)], 1),
    )
