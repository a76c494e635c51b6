"""Drafters that need no model: prompt lookup and suffix matching, and the hybrid of either with the draft.

A copying drafter reads the session's own tokens (prompt and output so far): it finds the longest recent
n-gram (`max_ngram` down to `min_ngram` tokens) that ends the sequence and occurred before, and proposes
what followed it. Its proposals are deterministic given the prefix, so each node's draft distribution is
one-hot on its token: the node is *fixed*. Speculative verification stays exact with one-hot drafts (a
fixed token x passes with probability target(x); after a rejection the target row loses x and is
renormalised, which is the residual norm(max(0, target - onehot(x)))). Several fixed children of one node
are tested one after another against the shrinking residual, which is SpecInfer's multi-draft rule with
one deterministic draft per child.

lookup  the continuation of the latest occurrence (transformers' prompt lookup, vLLM's n-gram drafter);
        one chain.
suffix  every occurrence of the longest matching suffix, their continuations merged in a trie with counts
        (the idea of SuffixDecoding, Oliaro et al. 2024): the most frequent continuation as a chain, or the
        top continuations as a tree bounded by the method's branching.
hybrid  a copy where a match exists and the draft model elsewhere; on trees, the copied chain and the
        model's candidates as branches of one tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..trees import Shape, TokenTree, branching_of
from ..verify.verdict import Verdict
from .base import Drafter, Option, Proposal, Setup

# occurrences of a suffix merged into the suffix trie (the latest ones): enough for frequencies, bounded cost
SUFFIX_OCCURRENCES = 64


class NgramIndex:
    """Where each n-gram (min_n <= n <= max_n) of a growing token list occurred, as the positions of the
    tokens that followed it, oldest first. `update` indexes the tokens appended since the last call."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.tables: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in range(min_n, max_n + 1)}
        self.indexed = 0  # continuation positions below this are indexed

    def update(self, tokens: list[int]) -> None:
        if len(tokens) < self.indexed:
            raise RuntimeError("an n-gram index follows one growing sequence; make a new one per generation")
        for p in range(max(self.indexed, self.min_n), len(tokens)):
            for n in range(self.min_n, min(self.max_n, p) + 1):
                self.tables[n].setdefault(tuple(tokens[p - n : p]), []).append(p)
        self.indexed = max(self.indexed, len(tokens))

    def match(self, tokens: list[int]) -> tuple[int, list[int]]:
        """(n, positions that followed earlier occurrences of the last n tokens) for the longest n with
        any; (0, []) when none matches."""
        self.update(tokens)
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            found = self.tables[n].get(tuple(tokens[-n:]))
            if found:
                return n, found
        return 0, []


@dataclass
class Copy:
    """A copying drafter's candidate for this iteration: a trie of continuations, breadth first."""

    key: str  # for the length controller: drafter and match length, e.g. "lookup:3"
    parents: list[int]
    tokens: list[int]
    counts: list[int]  # occurrences behind each node

    def head(self, g: int) -> Copy | None:
        """The first g nodes of a chain (None for g = 0)."""
        return Copy(self.key, self.parents[:g], self.tokens[:g], self.counts[:g]) if g > 0 else None


class CopyDrafter(Drafter):
    """Shared by `lookup` and `suffix`: find the match, lay its continuations out as a tree."""

    name = "copy"

    def __init__(self, setup: Setup, min_ngram: int = 1, max_ngram: int = 3):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.setup = setup
        self.index = NgramIndex(min_ngram, max_ngram)

    def find(self, context: list[int], shape: tuple[int, ...]) -> Copy | None:
        """The candidate tree for this iteration within `shape` (children per depth), or None."""
        n, positions = self.index.match(context)
        if not positions or not shape:
            return None
        return self.select(context, n, positions, shape)

    def select(self, tokens, n, positions, shape) -> Copy | None:
        raise NotImplementedError

    def propose(self, context: list[int], shape: Shape) -> Proposal:
        return fixed_proposal(self.setup, self.find(context, branching_of(shape)))

    def options(self, context: list[int], depth: int) -> list[Option]:
        copy = self.find(context, (1,) * depth)
        if copy is None:
            return []
        return [Option(copy.key, len(copy.tokens), None, lambda g: fixed_proposal(self.setup, copy.head(g)))]


class Lookup(CopyDrafter):
    """Prompt lookup: what followed the latest occurrence of the longest matching n-gram."""

    name = "lookup"

    def select(self, tokens, n, positions, shape):
        p = positions[-1]
        follow = tokens[p : p + len(shape)]
        return Copy(f"lookup:{n}", list(range(-1, len(follow) - 1)), follow, [1] * len(follow))


class Suffix(CopyDrafter):
    """Suffix matching: the continuations of every (recent) occurrence merged in a trie with counts; each
    node keeps its most frequent children (latest occurrence first on ties), as many as `shape` allows."""

    name = "suffix"

    def select(self, tokens, n, positions, shape):
        depth = len(shape)
        trie: dict[tuple[int, ...], list[int]] = {}  # path -> [count, latest occurrence]
        for rank, p in enumerate(positions[-SUFFIX_OCCURRENCES:]):
            follow = tokens[p : p + depth]
            for d in range(1, len(follow) + 1):
                entry = trie.setdefault(tuple(follow[:d]), [0, 0])
                entry[0] += 1
                entry[1] = rank
        parents, out_tokens, counts = [], [], []
        frontier = [((), -1)]  # (path, node index) of the previous depth
        for k in shape:
            nxt = []
            for path, node in frontier:
                kids = [(c, t) for c, t in _children(trie, path)]
                for count_latest, token in sorted(kids, reverse=True)[:k]:
                    parents.append(node)
                    out_tokens.append(token)
                    counts.append(count_latest[0])
                    nxt.append((path + (token,), len(out_tokens) - 1))
            frontier = nxt
        if not out_tokens:
            return None
        return Copy(f"suffix:{n}", parents, out_tokens, counts)


def _children(trie: dict, path: tuple[int, ...]):
    d = len(path) + 1
    for key, entry in trie.items():
        if len(key) == d and key[:-1] == path:
            yield (entry[0], entry[1]), key[-1]


def fixed_proposal(setup: Setup, copy: Copy | None) -> Proposal:
    """A proposal of fixed (one-hot) nodes. Draft rows are one-hot on each parent's first child, which is
    what chain verification reads; tree verification reads `fixed` instead."""
    device = setup.device
    if copy is None or not copy.tokens:
        return setup.empty()
    tree = (
        TokenTree.chain(len(copy.tokens))
        if copy.parents == list(range(-1, len(copy.tokens) - 1))
        else TokenTree.from_parents(copy.parents)
    )
    tokens = torch.tensor(copy.tokens, dtype=torch.long, device=device)
    rows = 1 + max(copy.parents) + 1
    draft_probs = torch.zeros(rows, setup.vocab_size, device=device)
    first = {}
    for g, p in enumerate(copy.parents):
        first.setdefault(p, g)
    draft_probs[[1 + p for p in first], tokens[list(first.values())]] = 1.0
    return Proposal(tree, tokens, draft_probs, fixed=torch.ones(len(copy.tokens), dtype=torch.bool, device=device))


class Hybrid(Drafter):
    """A copy where one exists, the draft model elsewhere. On a chain (every branching factor 1) one of the
    two proposes; on a tree the model's tree gets the copied chain as one more branch of the root."""

    name = "hybrid"

    def __init__(self, copier: CopyDrafter, model: Drafter | None):
        self.copier, self.model = copier, model

    def propose(self, context: list[int], shape: Shape) -> Proposal:
        branching = branching_of(shape)
        chain = all(k == 1 for k in branching)
        copy = self.copier.find(context, (1,) * len(branching))
        if self.model is None or (chain and copy is not None):
            return fixed_proposal(self.copier.setup, copy)
        proposal = self.model.propose(context, shape)
        if copy is None:
            return proposal
        return graft(proposal, fixed_proposal(self.copier.setup, copy))

    def accept(self, verdict: Verdict) -> None:
        """The model keeps what it proposed of the accepted path: its nodes come first in a grafted tree, so
        a path down the copied branch keeps none of them (and a copied chain left the model nothing)."""
        if self.model is not None:
            self.model.accept(verdict)

    def options(self, context: list[int], depth: int) -> list[Option]:
        return self.copier.options(context, depth) + (self.model.options(context, depth) if self.model else [])


def graft(base: Proposal, branch: Proposal) -> Proposal:
    """`base`'s tree with `branch` (a fixed chain) as one more child subtree of the root, after every node of
    `base`."""
    n = base.tree.size
    parents = base.tree.parents.tolist() + [-1 if p < 0 else n + p for p in branch.tree.parents.tolist()]
    device = base.tokens.device
    live = base.live if base.live is not None else torch.ones(n, dtype=torch.bool, device=device)
    fixed = base.fixed if base.fixed is not None else torch.zeros(n, dtype=torch.bool, device=device)
    return Proposal(
        TokenTree.from_parents(parents),
        torch.cat([base.tokens, branch.tokens]),
        base.draft_rows,
        torch.cat([live, torch.ones(branch.tree.size, dtype=torch.bool, device=device)]),
        torch.cat([fixed, branch.fixed]),
    )
