"""Token trees: proposed nodes laid out in a flat order with parent links.

Node g has a parent index (-1: the root, i.e. the last committed token) and a depth (1 for children
of the root). Parents always come before their children. A node sees the committed tokens, its
ancestors and itself; its position id is (committed length + depth - 1), the position it would have in
its own linear sequence. A chain is the tree with parents (-1, 0, 1, ...).

Scored rows follow one convention everywhere: row 0 is the root (the distribution after the last
committed token) and row 1 + g is node g (the distribution after it). Draft distributions are keyed the
same way, by the parent a node was drawn from.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# The most nodes a proposal may hold: a target forward over more tokens than this costs many plain steps
# on any hardware this project targets, and the 4-D mask grows with its square.
MAX_TREE_NODES = 256


@dataclass(frozen=True)
class TokenTree:
    parents: torch.Tensor  # [N] long, -1 for children of the root
    depth: torch.Tensor  # [N] long, 1-based
    visible: torch.Tensor  # [N, N] bool: visible[g, h] iff h is g or an ancestor of g
    is_chain: bool
    kids: tuple[tuple[int, ...], ...]  # kids[1 + g]: children of node g in order; kids[0]: the root's

    @property
    def size(self) -> int:
        return int(self.parents.shape[0])

    @property
    def max_depth(self) -> int:
        return int(self.depth.max()) if self.size else 0

    @classmethod
    def from_parents(cls, parents: list[int]) -> TokenTree:
        n = len(parents)
        if n > MAX_TREE_NODES:
            raise ValueError(f"a tree of {n} nodes is above the limit of {MAX_TREE_NODES}")
        visible = torch.eye(n, dtype=torch.bool)
        depth = torch.ones(n, dtype=torch.long)
        kids: list[list[int]] = [[] for _ in range(n + 1)]
        for g, parent in enumerate(parents):
            if not -1 <= parent < g:
                raise ValueError(f"node {g} has parent {parent}: parents must come before their children")
            if parent >= 0:
                visible[g] |= visible[parent]
                depth[g] = depth[parent] + 1
            kids[1 + parent].append(g)
        is_chain = list(parents) == list(range(-1, n - 1))
        return cls(torch.tensor(parents, dtype=torch.long), depth, visible, is_chain,
                   tuple(tuple(k) for k in kids))

    @classmethod
    def chain(cls, n: int) -> TokenTree:
        return _chain(n)

    @classmethod
    def from_branching(cls, branching: list[int] | tuple[int, ...]) -> TokenTree:
        """The full tree of a k-config (MCSD §3.7): k_1 children of the root, k_2 children of each of
        those, and so on. Breadth-first order, each node's children contiguous in draw order: child c of
        the i-th node of depth d is the (i * k_{d+1} + c)-th node of depth d + 1."""
        branching = tuple(branching)
        if not branching or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in branching):
            raise ValueError(f"branching factors must be integers >= 1, got {list(branching)}")
        width, total = 1, 0
        for k in branching:
            width *= k
            total += width
        if total > MAX_TREE_NODES:
            raise ValueError(f"the k-config {'x'.join(map(str, branching))} has {total} nodes, above the "
                             f"limit of {MAX_TREE_NODES}")
        parents, first, width = [], -1, 1  # `first`: index of the first node of the previous depth
        for k in branching:
            parents += [-1 if first < 0 else first + i // k for i in range(width * k)]
            first = len(parents) - width * k
            width *= k
        return cls.from_parents(parents)

    def children(self, g: int) -> tuple[int, ...]:
        """Children of node g in draw order; g = -1 is the root."""
        return self.kids[1 + g]

    def level(self, d: int) -> slice:
        """The nodes of depth d, for a tree laid out breadth first (as `from_branching` and chains are)."""
        idx = (self.depth == d).nonzero().flatten()
        if idx.numel() == 0:
            return slice(0, 0)
        start, stop = int(idx[0]), int(idx[-1]) + 1
        if stop - start != idx.numel():
            raise ValueError(f"the nodes of depth {d} are not contiguous: the tree is not breadth first")
        return slice(start, stop)

    def leaves(self) -> list[int]:
        return [g for g in range(self.size) if not self.kids[1 + g]]

    def path(self, g: int) -> list[int]:
        """Node indices from depth 1 down to g."""
        out = []
        while g >= 0:
            out.append(g)
            g = int(self.parents[g])
        return out[::-1]

    def is_root_path(self, nodes: list[int] | tuple[int, ...]) -> bool:
        """Whether `nodes` is a path down from the root (possibly empty), in depth order."""
        parent = -1
        for g in nodes:
            if not 0 <= g < self.size or int(self.parents[g]) != parent:
                return False
            parent = g
        return True


@functools.lru_cache(maxsize=64)
def _chain(n: int) -> TokenTree:
    # trees are immutable: a chain proposer asks for the same few lengths every iteration
    return TokenTree.from_parents(list(range(-1, n - 1)))


def parse_k_config(text: str | list | tuple) -> tuple[int, ...]:
    """'4x2x2' -> (4, 2, 2); a clear ValueError for anything else."""
    if isinstance(text, (list, tuple)):
        items = list(text)
    else:
        items = str(text).strip().lower().split("x") if str(text).strip() else []
    try:
        ks = tuple(int(k) for k in items)
    except (TypeError, ValueError):
        raise ValueError(f"k_config must look like 4x2x2 (branching factors >= 1 joined by 'x'), got {text!r}") \
            from None
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"k_config must look like 4x2x2 (branching factors >= 1 joined by 'x'), got {text!r}")
    TokenTree.from_branching(ks)  # the node limit
    return ks
