"""Token trees: proposed nodes laid out in a flat order with parent links.

Node g has a parent index (-1: the root, i.e. the last committed token) and a depth (1 for children
of the root). Parents always come before their children. A node sees the committed tokens, its
ancestors and itself; its position id is (committed length + depth - 1), the position it would have in
its own linear sequence. A chain is the tree with parents (-1, 0, 1, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenTree:
    parents: torch.Tensor  # [N] long, -1 for children of the root
    depth: torch.Tensor  # [N] long, 1-based
    visible: torch.Tensor  # [N, N] bool: visible[g, h] iff h is g or an ancestor of g
    is_chain: bool

    @property
    def size(self) -> int:
        return int(self.parents.shape[0])

    @classmethod
    def from_parents(cls, parents: list[int]) -> TokenTree:
        n = len(parents)
        visible = torch.eye(n, dtype=torch.bool)
        depth = torch.ones(n, dtype=torch.long)
        for g, parent in enumerate(parents):
            if not -1 <= parent < g:
                raise ValueError(f"node {g} has parent {parent}: parents must come before their children")
            if parent >= 0:
                visible[g] |= visible[parent]
                depth[g] = depth[parent] + 1
        is_chain = list(parents) == list(range(-1, n - 1))
        return cls(torch.tensor(parents, dtype=torch.long), depth, visible, is_chain)

    @classmethod
    def chain(cls, n: int) -> TokenTree:
        return cls.from_parents(list(range(-1, n - 1)))

    def path(self, g: int) -> list[int]:
        """Node indices from depth 1 down to g."""
        out = []
        while g >= 0:
            out.append(g)
            g = int(self.parents[g])
        return out[::-1]
