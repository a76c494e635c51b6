"""Token trees that fit a pair and a machine: acceptance by sibling rank, the optimal tree of n nodes (the
dynamic programme of Sequoia, Chen et al., 2024), and the tree that gives the most tokens per second.

Glossary:
  rank    a child's place in its parent's draw order (0: drawn first). Tree verification tests children in
          draw order, so the rank-i child is tried only when ranks < i were rejected.
  rate    rate[d][i]: the probability that the rank-i child at depth d (1-based) is accepted, given that its
          parent was accepted and ranks < i were rejected. Measured as accepts / tries (`RankAcceptance`).
  reach   reach[d][i] = rate[d][i] * prod_{j < i} (1 - rate[d][j]): the probability that the rank-i child is
          the accepted one, given that its parent was.
  value   of a tree: the expected tokens one target call commits, 1 + sum over nodes of the product of the
          reaches on the node's path (the 1 is the bonus or replacement token). This is Sequoia's positional
          acceptance assumption: acceptance depends on depth and rank, not on the tokens.

`optimal_trees` finds, for every node count n up to a budget and every depth limit, the tree of the highest
value; `fastest_tree` weighs each against its cost (one target forward over n + 1 tokens, one draft forward
per level but the deepest at that level's width, and the per-iteration work) and keeps the best, zero
drafts included.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass, field

import numpy as np

from .models.cost import ForwardCost
from .trees import TokenTree

MAX_CHILDREN = 8  # ranks the search considers per node
# prior acceptance per rank where nothing was measured: Beta(1, 3 (i + 1) - 1), means 1/3, 1/6, 1/9, ...
PRIOR_STRENGTH = 3.0
DEPTH_SHRINK = 4.0  # pseudo-tries pulling a depth's rate towards the rate pooled over depths


def _prior_means(prior: list[float] | None, ranks: int) -> np.ndarray:
    """[ranks] prior rates: `prior[i]` where given, else 1 / (3 (i + 1))."""
    return np.array([prior[i] if prior and i < len(prior) else 1.0 / (3 * (i + 1)) for i in range(ranks)])


@dataclass
class RankAcceptance:
    """Tries and accepts by depth (row d - 1) and rank (column i) for one drafter and draw mode."""

    tries: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    accepts: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    def _grow(self, depth: int, rank: int) -> None:
        rows, cols = max(self.tries.shape[0], depth), max(self.tries.shape[1], rank + 1)
        if (rows, cols) != self.tries.shape:
            grown = [np.zeros((rows, cols)) for _ in range(2)]
            for new, old in zip(grown, (self.tries, self.accepts), strict=True):
                new[: old.shape[0], : old.shape[1]] = old
            self.tries, self.accepts = grown

    def record(self, depth: int, rank: int, accepted: bool) -> None:
        self._grow(depth, rank)
        self.tries[depth - 1, rank] += 1
        self.accepts[depth - 1, rank] += accepted

    def merge(self, other: RankAcceptance) -> None:
        if other.tries.size:
            self._grow(*other.tries.shape[:1], other.tries.shape[1] - 1)
            self.tries[: other.tries.shape[0], : other.tries.shape[1]] += other.tries
            self.accepts[: other.accepts.shape[0], : other.accepts.shape[1]] += other.accepts

    def pooled(
        self, prior: list[float] | None = None, ranks: int = MAX_CHILDREN, weight: float | None = None
    ) -> np.ndarray:
        """rate[i] over all depths, each rank pulled towards `prior[i]` (default: 1 / (3 (i + 1))) with the
        weight of `weight` tries (default PRIOR_STRENGTH)."""
        weight = PRIOR_STRENGTH if weight is None else weight
        means = _prior_means(prior, ranks)
        tries, accepts = np.zeros(ranks), np.zeros(ranks)
        cols = min(ranks, self.tries.shape[1])
        tries[:cols], accepts[:cols] = self.tries.sum(0)[:cols], self.accepts.sum(0)[:cols]
        return (accepts + weight * means) / (tries + weight)

    def rates(
        self,
        depth: int,
        prior: list[float] | list[list[float]] | None = None,
        ranks: int = MAX_CHILDREN,
        weight: float | None = None,
    ) -> np.ndarray:
        """rate[d][i] for depths 1..depth. Without a prior, or with one row for every depth, each depth's counts
        are pulled towards the rate pooled over depths (itself pulled towards the prior, or 1 / (3 (i + 1))). A
        prior by depth (rows, the last for every deeper level: what `multispec tune` measured at each depth)
        pulls each depth's counts towards its own row with the weight of `weight` tries."""
        rows, cols = min(depth, self.tries.shape[0]), min(ranks, self.tries.shape[1])
        if prior and isinstance(prior[0], (list, tuple)):
            weight = PRIOR_STRENGTH if weight is None else weight
            out = np.stack([_prior_means(prior[min(d, len(prior) - 1)], ranks) for d in range(depth)])
            if rows and cols:
                t, a = self.tries[:rows, :cols], self.accepts[:rows, :cols]
                out[:rows, :cols] = (a + weight * out[:rows, :cols]) / (t + weight)
            return out
        pooled = self.pooled(prior, ranks, weight)
        out = np.tile(pooled, (depth, 1))
        if rows and cols:
            t, a = self.tries[:rows, :cols], self.accepts[:rows, :cols]
            out[:rows, :cols] = (a + DEPTH_SHRINK * pooled[:cols]) / (t + DEPTH_SHRINK)
        return out

    def prior_text(self, depth: int) -> str:
        """`rates(depth)` as tree=auto's `acceptance=` prior: a row per measured depth and then the pooled row,
        which the rows beyond the measured depths are ('0.4/0.2;0.5/0.3;...', rank 0 first)."""
        rows = self.rates(depth)[: min(depth, self.tries.shape[0] + 1)]
        return ";".join("/".join(f"{r:.3f}" for r in row) for row in rows)

    def as_dict(self) -> dict:
        """For stats: counts and the measured rates (None where nothing was tried)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            rates = np.where(self.tries > 0, self.accepts / np.maximum(self.tries, 1), np.nan)
        return {
            "tries": self.tries.astype(int).tolist(),
            "accepts": self.accepts.astype(int).tolist(),
            "rates": [[None if np.isnan(x) else round(float(x), 4) for x in row] for row in rates],
        }

    @classmethod
    def from_dict(cls, data: dict) -> RankAcceptance:
        tries, accepts = np.array(data["tries"], dtype=float), np.array(data["accepts"], dtype=float)
        if tries.ndim != 2 or tries.shape != accepts.shape:
            tries, accepts = np.zeros((0, 0)), np.zeros((0, 0))
        return cls(tries, accepts)


def record_verdict(
    ranks: dict[str, RankAcceptance],
    key: str,
    tree: TokenTree,
    accepted: tuple[int, ...],
    rejected: bool,
    live=None,
    fixed=None,
) -> None:
    """Count one tree verification by sibling rank: walking down the accepted path, each parent's children were
    tried in order (fixed, copied children first, counted under "copy") up to the accepted one, or all of them
    after a rejection. Padding children (`live` False) are never tried."""
    node = -1
    for d in range(len(accepted) + 1):
        kids = [k for k in tree.children(node) if live is None or bool(live[k])]
        if not kids:
            return
        chosen = accepted[d] if d < len(accepted) else None
        if chosen is None and not rejected:
            return
        copied = [k for k in kids if fixed is not None and bool(fixed[k])]
        drawn = [k for k in kids if k not in copied]
        for group, name in ((copied, "copy"), (drawn, key)):
            for rank, k in enumerate(group):
                counts = ranks.setdefault(name, RankAcceptance())
                counts.record(d + 1, rank, k == chosen)
                if k == chosen:
                    break
            if chosen in group:
                break
        node = chosen


def reach_of(rates: np.ndarray) -> np.ndarray:
    """reach[d][i] = rate[d][i] prod_{j < i} (1 - rate[d][j]) (glossary)."""
    rates = np.clip(rates, 0.0, 1.0)
    survive = np.cumprod(np.concatenate([np.ones((rates.shape[0], 1)), 1 - rates[:, :-1]], 1), 1)
    return rates * survive


def tree_value(tree: TokenTree, reach: np.ndarray) -> float:
    """Expected tokens per target call of `tree` under `reach` (glossary); deeper rows repeat the last."""
    value = np.ones(tree.size + 1)  # value[1 + g]: probability node g is accepted; [0] the root
    for g in range(tree.size):
        parent = int(tree.parents[g])
        rank = tree.children(parent).index(g)
        row = reach[min(int(tree.depth[g]), reach.shape[0]) - 1]
        value[1 + g] = value[1 + parent] * (row[rank] if rank < row.shape[0] else 0.0)
    return float(value.sum())


@functools.lru_cache(maxsize=64)
def _table(reach: bytes, shape: tuple[int, int], max_nodes: int, max_depth: int) -> TreeTable:
    return TreeTable(np.frombuffer(reach, dtype=np.float64).reshape(shape), max_nodes, max_depth)


def table_for(rates: np.ndarray, max_nodes: int, max_depth: int) -> TreeTable:
    """The `TreeTable` of these acceptance rates, reused while the rates are unchanged (the first searches of
    every call start from the same prior)."""
    reach = np.ascontiguousarray(reach_of(rates), dtype=np.float64)
    return _table(reach.tobytes(), reach.shape, max_nodes, max_depth)


class TreeTable:
    """The optimal trees of 0..max_nodes nodes for every depth limit 1..max_depth, under `reach` [D, K] (row
    d - 1 for children at depth d; deeper levels use the last row).

    The programme, per depth limit D, from the deepest level up: best[L][m] is the highest value of a subtree
    of m nodes whose top node sits at level L (its own weight 1); the top node's children take ranks 0, 1, ...
    in order (a child of rank i exists only with the ranks before it), and the m - 1 nodes below are split
    among them by a max-plus convolution, rank by rank:
        fill[i][m] = max_{1 <= a <= m} reach[L][i] * best[L + 1][a] + fill[i + 1][m - a],  fill[i][0] = 0,
        best[L][m] = 1 + fill[0][m - 1].
    The root is level 0, so a tree of n drafted nodes has value best[0][n + 1].
    Every depth limit runs at once (tree=auto searches during decoding): at step s each limit D > s works on
    its level D - 1 - s, so a step is one batch of max-plus convolutions, [limits, m, a].
    """

    def __init__(self, reach: np.ndarray, max_nodes: int, max_depth: int):
        self.max_nodes, self.max_depth = max_nodes, max_depth
        size, ranks = max_nodes + 2, reach.shape[1]
        limits = np.arange(1, max_depth + 1)  # [L]: the depth limits D
        best = np.full((max_depth, size), -np.inf)  # [L, m]: each limit's best at its current level
        best[:, 1] = 1.0  # each limit starts at its deepest level: leaves
        # picks[D - 1, level, i, m]: the subtree size of the rank-i child when ranks >= i share m nodes
        self._picks = np.zeros((max_depth, max_depth, ranks, size), dtype=np.int64)
        for step in range(max_depth):
            active = limits[step:]  # the limits with a level left: D > step
            level = active - 1 - step  # [A]
            rows = reach[np.minimum(level, reach.shape[0] - 1)]  # [A, K]
            below = best[step:]  # [A, m]
            finite = np.isfinite(below)
            base = np.where(finite, below, 0.0)
            # padded[:, size - 1 + j] = fill[j] and -inf before it, so that row m of its reversed windows reads
            # fill[m - a] at column a, and -inf where a > m (nodes left for later ranks: m - a)
            padded = np.full((active.size, 2 * size - 1), -np.inf)
            padded[:, size - 1] = 0.0  # fill[0] = 0: no nodes left, nothing more to add
            windows = np.lib.stride_tricks.sliding_window_view(padded, size, axis=1)[:, :, ::-1]  # [A, m, a]
            for i in range(ranks - 1, -1, -1):
                # gain[a]: a child of rank i with a subtree of a nodes (0 * -inf would be nan)
                gain = np.where(finite, rows[:, i : i + 1] * base, -np.inf)
                gain[:, 0] = -np.inf
                total = gain[:, None, :] + windows  # [A, m, a]
                pick = total.argmax(2)  # [A, m]
                new = np.take_along_axis(total, pick[:, :, None], 2)[:, :, 0]
                new[:, 0] = 0.0
                padded[:, size - 1 :] = new
                self._picks[active - 1, level, i] = pick
            best[step:, 0] = -np.inf
            best[step:, 1:] = 1.0 + padded[:, size - 1 : 2 * size - 2]
        self.values = np.full((max_depth + 1, max_nodes + 1), -np.inf)  # values[D][n]
        self.values[:, 0] = 1.0
        self.values[1:, :] = best[:, 1:]  # n drafted nodes: the root plus n
        self._widths: dict[tuple[int, int], tuple[int, ...]] = {}

    def value(self, n: int, depth: int) -> float:
        return float(self.values[depth, n])

    def sizes(self, n: int, depth: int) -> list[list[int]]:
        """The subtree sizes of the optimal tree's nodes, level by level, without building it: [[n + 1], the
        root's children's subtree sizes, ...]; each level's widths follow."""
        choices = self._picks[depth - 1]
        levels, frontier = [[n + 1]], [n + 1]
        for level in range(depth):
            nxt = []
            for size in frontier:
                left, i = size - 1, 0
                while left > 0:
                    a = int(choices[level][i][left])
                    nxt.append(a)
                    left -= a
                    i += 1
            if not nxt:
                break
            levels.append(nxt)
            frontier = nxt
        return levels

    def widths(self, n: int, depth: int) -> tuple[int, ...]:
        """Nodes per level (from depth 1) of the optimal tree of n nodes under the depth limit."""
        key = (n, depth)
        if key not in self._widths:
            self._widths[key] = tuple(len(level) for level in self.sizes(n, depth)[1:])
        return self._widths[key]

    def tree(self, n: int, depth: int) -> TokenTree:
        if n == 0:
            return TokenTree.chain(0)
        choices, parents = self._picks[depth - 1], []

        def build(level: int, node: int, size: int) -> None:
            left, i, kids = size - 1, 0, []
            while left > 0:
                a = int(choices[level][i][left])
                parents.append(node)
                kids.append((len(parents) - 1, a))
                left -= a
                i += 1
            for child, a in kids:
                build(level + 1, child, a)

        build(0, -1, n + 1)
        return TokenTree.canonical(parents)


@dataclass(frozen=True)
class TreeChoice:
    nodes: int
    depth: int  # the depth limit it was found under
    tokens: float  # expected tokens per target call
    seconds: float  # predicted seconds per iteration
    widths: tuple[int, ...]  # nodes per depth

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


def iteration_seconds(
    widths,
    target_cost: ForwardCost,
    draft_cost: ForwardCost | None,
    context: int,
    overhead: float,
    pending: int = 1,
    catch_up: int = 1,
) -> float:
    """Predicted seconds of one tree iteration: the target over `pending` + every node, the draft over
    `catch_up` committed tokens and then each level but the deepest, and `overhead` (sampling, verifying,
    committing: measured)."""
    n = sum(widths)
    seconds = target_cost(pending + n, context) + overhead
    if n and draft_cost is not None:
        seconds += draft_cost(catch_up, context) + sum(draft_cost(w, context) for w in widths[:-1])
    return seconds


def fastest_tree(
    table: TreeTable,
    target_cost: ForwardCost,
    draft_cost: ForwardCost | None,
    context: int,
    overhead: float = 0.0,
    max_depth: int | None = None,
    pending: int = 1,
    per_node: float = 0.0,
    plain_cost: ForwardCost | None = None,
    chain_cost: ForwardCost | None = None,
    chain_draft_cost: ForwardCost | None = None,
    plain_overhead: float | None = None,
    chain_overhead: tuple[float, float] | None = None,
    switch: float = 0.0,
    margin: float = 0.0,
    others_tokens: float = 0.0,
    others_drafting: int = 0,
) -> TreeChoice:
    """Among the optimal trees of every size and depth limit (and no tree), the most tokens per second.
    Each kind of iteration is priced as it runs: a tree by `target_cost` and `draft_cost`, with per-iteration
    work `overhead` + `per_node` x nodes; a chain (one child per node, which the engine scores without a mask)
    by `chain_cost` and `chain_draft_cost` (default the tree's) and work `chain_overhead` = (per iteration, per
    node) (default the tree's); a plain step by `plain_cost` (default `chain_cost`) and `plain_overhead`
    (default `overhead`). `switch`: seconds per token that drafting pays on top, none (a one-time cost, such as
    a draft that must first read the tokens it has not seen, spread over the tokens left). `margin`: drafting is
    chosen only where it is that fraction faster than a plain step (prices measured from a few runs err by a
    few per cent, and a drafting iteration priced barely faster may well be slower).
    In a batch (`multispec.batching.RowLoad`) the costs are the batch's forwards and the rate is the batch's:
    `others_tokens`, what the other rows are expected to commit in the same iteration, is added to every choice's
    tokens, and `others_drafting`, the longest chain another row drafts, is a number of one-token draft forwards
    the iteration runs whatever this row chooses (a shallower tree waits for the rest)."""
    chain_cost = chain_cost or target_cost
    chain_draft_cost = chain_draft_cost or draft_cost
    plain_overhead = overhead if plain_overhead is None else plain_overhead
    chain_overhead = (overhead, per_node) if chain_overhead is None else tuple(chain_overhead)
    # the other rows' draft forwards: one-token steps of the draft, which this row's own levels replace
    drafter_cost = chain_draft_cost or draft_cost
    one_level = drafter_cost(1, context) if others_drafting and drafter_cost is not None else 0.0
    waiting = others_drafting * one_level
    plain = TreeChoice(0, 0, 1.0, (plain_cost or chain_cost)(pending, context) + plain_overhead + waiting, ())
    # the best drafting choice so far: at first a placeholder as fast as a plain step with its margin
    best = TreeChoice(0, 0, 1.0, plain.seconds, ())
    best_rate = (others_tokens + 1.0) * (1.0 + margin) / plain.seconds
    top = table.max_depth if max_depth is None else min(max_depth, table.max_depth)
    # the curves read once per size (this search runs during decoding)
    sizes = np.arange(table.max_nodes + 1)
    work = overhead + per_node * sizes
    forward = target_cost.curve(pending + table.max_nodes, context)[pending:] + work
    chained = (
        forward
        if chain_cost is target_cost and chain_overhead == (overhead, per_node)
        else chain_cost.curve(pending + table.max_nodes, context)[pending:]
        + chain_overhead[0]
        + chain_overhead[1] * sizes
    )
    drafting = draft_cost.curve(table.max_nodes, context).tolist() if draft_cost else None
    chain_drafting = (
        drafting
        if chain_draft_cost is draft_cost
        else chain_draft_cost.curve(1, context).tolist()
        if chain_draft_cost
        else None
    )
    # tokens over the target's part alone bound a tree's speed from above (a chain's over the cheaper of the
    # two forwards): visit trees from the highest bound down and stop below the best found (depth limits,
    # then sizes, in order among equal bounds)
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = (others_tokens + table.values[1 : top + 1, 1:]) / np.minimum(forward, chained)[None, 1:]
    bound = np.where(np.isfinite(bound), bound, -np.inf).ravel()  # [depth - 1, n - 1], flattened
    for flat in np.argsort(-bound, kind="stable"):
        if bound[flat] < best_rate:
            break
        depth, n = divmod(int(flat), table.max_nodes)
        depth, n = depth + 1, n + 1
        widths = table.widths(n, depth)
        if depth > 1 and len(widths) < depth:  # the same tree as under a smaller limit
            continue
        chain = len(widths) == n
        seconds = float((chained if chain else forward)[n])
        levels = chain_drafting if chain else drafting
        if levels is not None:  # as `iteration_seconds`: the catch-up token, then every level but the last
            seconds += levels[1] + sum(levels[w] for w in widths[:-1])
        seconds += max(0, others_drafting - len(widths)) * one_level
        tokens = table.value(n, depth)
        seconds += switch * tokens
        speed = (others_tokens + tokens) / seconds
        # among equal speeds: no tree, then the smallest depth limit and size
        if speed > best_rate or (speed == best_rate and best.nodes and (depth, n) < (best.depth, best.nodes)):
            best, best_rate = TreeChoice(n, depth, tokens, seconds, widths), speed
    return best if best.nodes else plain


def value_bound(reach: np.ndarray, max_nodes: int, max_depth: int) -> np.ndarray:
    """[n] for n = 0..max_nodes: a bound on the value of any tree of n nodes and depth <= max_depth under
    `reach`: 1 + the n largest path products over every place a node can take (depth, rank under each
    ancestor), since a tree's n nodes take n distinct places. A heap walk, O(n K log n)."""
    rows = [reach[min(d, reach.shape[0] - 1)] for d in range(max_depth)]
    heap = [(-float(r), 1) for r in rows[0] if r > 0]  # (minus the path product, depth)
    heapq.heapify(heap)
    out = np.ones(max_nodes + 1)
    for n in range(1, max_nodes + 1):
        out[n] = out[n - 1]
        if not heap:
            continue
        product, depth = heapq.heappop(heap)
        out[n] -= product
        if depth < max_depth:
            for r in rows[depth]:
                if r > 0:
                    heapq.heappush(heap, (product * float(r), depth + 1))
    return out


def search_tree(
    rates: np.ndarray,
    max_nodes: int,
    max_depth: int,
    target_cost: ForwardCost,
    draft_cost: ForwardCost | None,
    context: int,
    overhead: float = 0.0,
    pending: int = 1,
    per_node: float = 0.0,
    first: int = 16,
    **prices,
) -> tuple[TreeChoice, TreeTable]:
    """`fastest_tree` over the optimal trees of up to `max_nodes` nodes (its pricing arguments pass through),
    and the table it chose from. The table's programme costs the square of its budget, and the fastest tree
    is usually small: the trees of up to `first` nodes are searched first, and the whole budget only where
    `value_bound` over the cheapest forward says that a larger tree could be faster."""
    small = min(first, max_nodes)
    table = table_for(rates, small, max_depth)
    choice = fastest_tree(
        table, target_cost, draft_cost, context, overhead, pending=pending, per_node=per_node, **prices
    )
    if small == max_nodes:
        return choice, table
    sizes = np.arange(small + 1, max_nodes + 1)
    forward = target_cost.curve(pending + max_nodes, context)[pending + sizes] + overhead + per_node * sizes
    chain_work = prices.get("chain_overhead") or (overhead, per_node)
    # a chain may run on a cheaper curve, with less work
    chained = (
        (prices.get("chain_cost") or target_cost).curve(pending + max_nodes, context)[pending + sizes]
        + chain_work[0]
        + chain_work[1] * sizes
    )
    others = prices.get("others_tokens", 0.0)
    bound = (others + value_bound(reach_of(rates), max_nodes, max_depth)[sizes]) / np.minimum(forward, chained)
    if bound.max() < (others + choice.tokens) / choice.seconds:  # no larger tree can be as fast
        return choice, table
    table = table_for(rates, max_nodes, max_depth)
    return fastest_tree(
        table, target_cost, draft_cost, context, overhead, pending=pending, per_node=per_node, **prices
    ), table
