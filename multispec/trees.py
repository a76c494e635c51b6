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
from pathlib import Path

import numpy as np
import torch

from .params import read_json, short_repr

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

    # read every iteration by the drafters: kept as Python values (a tensor call each time costs more here)
    @functools.cached_property
    def max_depth(self) -> int:
        return int(self.depth.max()) if self.size else 0

    @functools.cached_property
    def _levels(self) -> dict[int, slice]:
        """Depth -> its nodes, for depths whose nodes are contiguous."""
        depths = self.depth.tolist()
        found: dict[int, slice] = {}
        for d in range(1, self.max_depth + 1):
            nodes = [g for g, dg in enumerate(depths) if dg == d]
            if nodes[-1] + 1 - nodes[0] == len(nodes):
                found[d] = slice(nodes[0], nodes[-1] + 1)
        return found

    @functools.cached_property
    def parent_list(self) -> tuple[int, ...]:
        return tuple(self.parents.tolist())

    @functools.cached_property
    def _layouts(self) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]:
        return {}

    def layout(self, nodes: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """The depths [1, S] of the nodes `nodes` (a slice from a node to another) and what each sees among
        the nodes before its slice's end [1, S, stop]: a feed's entries, made once per slice (a drafter feeds
        the same levels every iteration)."""
        key = (nodes.start or 0, nodes.stop)
        if key not in self._layouts:
            self._layouts[key] = (self.depth[nodes][None], self.visible[nodes, : nodes.stop][None])
        return self._layouts[key]

    @classmethod
    def from_parents(cls, parents: list[int]) -> TokenTree:
        parents = [int(p) for p in parents]
        n = len(parents)
        if n > MAX_TREE_NODES:
            raise ValueError(f"a tree of {n} nodes is above the limit of {MAX_TREE_NODES}")
        visible = np.eye(n, dtype=bool)  # numpy rows: a per-node torch op costs ~10x more
        depth = np.ones(n, dtype=np.int64)
        kids: list[list[int]] = [[] for _ in range(n + 1)]
        for g, parent in enumerate(parents):
            if not -1 <= parent < g:
                raise ValueError(f"node {g} has parent {parent}: parents must come before their children")
            if parent >= 0:
                visible[g] |= visible[parent]
                depth[g] = depth[parent] + 1
            kids[1 + parent].append(g)
        is_chain = parents == list(range(-1, n - 1))
        return cls(
            torch.tensor(parents, dtype=torch.long),
            torch.from_numpy(depth),
            torch.from_numpy(visible),
            is_chain,
            tuple(tuple(k) for k in kids),
        )

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
            if total > MAX_TREE_NODES:  # (before the products grow to numbers thousands of digits long)
                break
        if total > MAX_TREE_NODES:
            shown = "x".join(map(str, branching[:16])) + ("x..." if len(branching) > 16 else "")
            raise ValueError(
                f"the k-config {shown} has {'more than ' if len(branching) > 16 else ''}{total} nodes, "
                f"above the limit of {MAX_TREE_NODES}"
            )
        return _full_tree(branching)

    @classmethod
    def canonical(cls, parents: list[int]) -> TokenTree:
        """The same tree relabelled breadth first, each node's children contiguous and in their order (the
        order they are drawn and tested in): the layout a drafter expands level by level."""
        return _canonical(tuple(int(p) for p in parents))

    @classmethod
    def _relabel(cls, parents: tuple[int, ...]) -> TokenTree:
        tree = cls.from_parents(list(parents))
        order, frontier = [], [-1]
        while frontier:
            frontier = [c for g in frontier for c in tree.children(g)]
            order += frontier
        new = {g: i for i, g in enumerate(order)}
        return cls.from_parents([-1 if parents[g] < 0 else new[parents[g]] for g in order])

    @classmethod
    def from_nested(cls, nested: list) -> TokenTree:
        """A tree written as nested lists, each list a node's children: [[[], []], []] is a root with two
        children, the first of which has two (leaf) children."""
        parents: list[int] = []

        def walk(children, parent: int, depth: int) -> None:
            if not isinstance(children, list):
                raise ValueError(f"a nested tree holds only lists, found {children!r}")
            if depth > MAX_TREE_NODES:
                raise ValueError("the nested tree is deeper than the node limit")
            for child in children:
                parents.append(parent)
                walk(child, len(parents) - 1, depth + 1)

        walk(nested, -1, 0)
        return cls.canonical(parents)

    def truncate(self, depth: int) -> TokenTree:
        """The nodes of depth <= `depth` (a prefix of a breadth-first tree)."""
        if depth >= self.max_depth:
            return self
        n = int((self.depth <= depth).sum())
        if bool((self.depth[:n] > depth).any()):
            raise ValueError("truncate needs a breadth-first tree")
        return TokenTree.chain(n) if self.is_chain else TokenTree.from_parents(self.parents[:n].tolist())

    def widths(self) -> list[int]:
        """Nodes per depth, from depth 1."""
        return torch.bincount(self.depth, minlength=self.max_depth + 1)[1:].tolist()

    def branching(self) -> tuple[int, ...]:
        """The most children of any node at each depth: the k-config that holds this tree."""
        most = [0] * self.max_depth
        for g in range(-1, self.size):
            d = 0 if g < 0 else int(self.depth[g])
            if d < self.max_depth:
                most[d] = max(most[d], len(self.children(g)))
        return tuple(most)

    def describe(self) -> str:
        """A short label: '12 nodes, depth 4, widths 4-4-3-1'."""
        return f"{self.size} nodes, depth {self.max_depth}, widths {'-'.join(map(str, self.widths()))}"

    def children(self, g: int) -> tuple[int, ...]:
        """Children of node g in draw order; g = -1 is the root."""
        return self.kids[1 + g]

    @functools.cached_property
    def _draws(self) -> dict[tuple[int, str], tuple[int, torch.Tensor | None]]:
        return {}

    def draws(self, d: int, device) -> tuple[int, torch.Tensor | None]:
        """For a drafter that draws level d as k children per node of level d - 1 (the root for d = 1): k, the
        most children such a node has, and where the level's nodes sit in the flattened [nodes, k] grid of draws
        ([n] long on `device`), or None when every node has k children. Made once per level and device."""
        key = (d, str(device))
        if key not in self._draws:
            parents = [-1] if d == 1 else range(self.level(d - 1).start, self.level(d - 1).stop)
            counts = [len(self.children(g)) for g in parents]
            level = self.level(d)
            if [c for g in parents for c in self.children(g)] != list(range(level.start, level.stop)):
                raise ValueError("a drafted tree must be laid out breadth first (TokenTree.canonical)")
            k = max(counts)
            index = (
                None
                if min(counts) == k
                else torch.tensor([p * k + j for p, c in enumerate(counts) for j in range(c)], device=device)
            )
            self._draws[key] = (k, index)
        return self._draws[key]

    def level(self, d: int) -> slice:
        """The nodes of depth d, for a tree laid out breadth first (as `from_branching` and chains are)."""
        if not 1 <= d <= self.max_depth:
            return slice(0, 0)
        if d not in self._levels:
            raise ValueError(f"the nodes of depth {d} are not contiguous: the tree is not breadth first")
        return self._levels[d]

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


@functools.lru_cache(maxsize=256)
def _full_tree(branching: tuple[int, ...]) -> TokenTree:
    # trees are immutable, and a tree method asks for the same k-config every call and every iteration
    parents, first, width = [], -1, 1  # `first`: index of the first node of the previous depth
    for k in branching:
        parents += [-1 if first < 0 else first + i // k for i in range(width * k)]
        first = len(parents) - width * k
        width *= k
    return TokenTree.from_parents(parents)


@functools.lru_cache(maxsize=1024)
def _canonical(parents: tuple[int, ...]) -> TokenTree:
    return TokenTree._relabel(parents)


@functools.lru_cache(maxsize=64)
def _chain(n: int) -> TokenTree:
    # trees are immutable: a chain proposer asks for the same few lengths every iteration
    return TokenTree.from_parents(list(range(-1, n - 1)))


Shape = tuple[int, ...] | TokenTree  # what a drafter is asked for: a k-config (a chain: all ones) or a tree


def shape_depth(shape: Shape) -> int:
    return shape.max_depth if isinstance(shape, TokenTree) else len(shape)


def cut(shape: Shape, depth: int) -> Shape:
    """`shape` down to `depth` levels (the room left)."""
    return shape.truncate(depth) if isinstance(shape, TokenTree) else shape[:depth]


def branching_of(shape: Shape) -> tuple[int, ...]:
    """The k-config of a shape: itself, or the most children per depth of a tree."""
    return shape.branching() if isinstance(shape, TokenTree) else tuple(shape)


def parse_k_config(text: str | list | tuple) -> tuple[int, ...]:
    """'4x2x2' -> (4, 2, 2); a clear ValueError for anything else."""
    if isinstance(text, (list, tuple)):
        items = list(text)
    else:
        items = str(text).strip().lower().split("x") if str(text).strip() else []
    try:
        ks = tuple(int(k) for k in items)
    except (TypeError, ValueError):
        raise ValueError(
            f"k_config must look like 4x2x2 (branching factors >= 1 joined by 'x'), got {short_repr(text)}"
        ) from None
    if not ks or any(k < 1 for k in ks):
        raise ValueError(
            f"k_config must look like 4x2x2 (branching factors >= 1 joined by 'x'), got {short_repr(text)}"
        )
    TokenTree.from_branching(ks)  # the node limit
    return ks


def load_tree(path: str | Path) -> TokenTree:
    """A tree from a JSON file: a list of parent indices ([-1, -1, 0]: two children of the root, the first
    with one child; parents before children), an object {"parents": [...]}, or nested lists (see
    `TokenTree.from_nested`). The tree files `multispec tune` writes beside a plan hold {"parents": [...]}."""
    return tree_from_json(read_json(path, "tree file"), str(path))


def tree_from_json(data, where: str = "the tree") -> TokenTree:
    if isinstance(data, dict):
        if "parents" not in data:
            raise ValueError(f"{where}: an object must have a 'parents' list")
        data = data["parents"]
    if not isinstance(data, list) or not data:
        raise ValueError(f"{where}: expected a non-empty list of parent indices or nested lists")
    if all(isinstance(x, list) for x in data):
        return TokenTree.from_nested(data)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in data):
        raise ValueError(f"{where}: a list of parent indices holds integers only (or use nested lists)")
    try:
        return TokenTree.canonical(data)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
