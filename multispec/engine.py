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

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable

import torch

from .models.base import LanguageModel
from .trees import TokenTree
from .verify.verdict import Verdict
from .warp import Sampling


class ModelRunner:
    def __init__(self, model: LanguageModel):
        self.model = model
        self.cache = model.new_cache()
        self.committed = 0  # committed tokens held in the cache
        self.tentative = 0  # proposed entries after them
        self.calls = 0
        self.fed: Counter[int] = Counter()  # forwards by the tokens they fed (rows x tokens per row)
        self.seconds = 0.0  # in forwards, one-time compiles included
        self.one_time = 0.0  # of which: compiling forwards for new shapes
        self._compiled_seen = getattr(model, "compile_seconds", 0.0)
        self.tree: TokenTree | None = None  # the tree the tentative entries belong to (None: a chain)
        self.paths: list[list[int]] | None = None  # with `feed_paths`: the path each cache row holds
        self.rows = 1  # cache rows, one per hypothesis (`feed_rows` / `commit_rows`)

    def _timed(self, t0: float) -> None:
        self.seconds += time.perf_counter() - t0
        compiled = getattr(self.model, "compile_seconds", 0.0)
        self.one_time += compiled - self._compiled_seen
        self._compiled_seen = compiled

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
        if (pending and self.tentative) or self.paths is not None:
            raise RuntimeError("committed tokens cannot be fed after tentative entries; commit first")
        if self.rows != 1:
            raise RuntimeError(f"the cache holds {self.rows} hypotheses: use feed_rows")
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
            self.tree = tree
        t0 = time.perf_counter()
        logits = self.model.forward(
            self.cache, inputs, positions[None], mask, logits_to_keep=n_extra + (1 if pending else 0)
        )
        self._timed(t0)
        self.calls += 1
        self.fed[inputs.numel()] += 1
        self.committed += len(pending)
        self.tentative += n_extra
        return logits[0]

    def feed_paths(self, tokens: list[int], extra: torch.Tensor, tree: TokenTree) -> torch.Tensor:
        """Score a tree without tree attention (MCSD §3.11): the cache is copied once per root-to-leaf
        path and each batch row feeds the uncached committed tokens and its path. Same rows as
        `feed(tokens, extra, tree=tree)` - [1 + N, V], row 0 the root, row 1 + g node g - at the cost of
        K copies of the cache and K times the work."""
        pending = tokens[self.committed :]
        if self.tentative or self.paths is not None or not pending:
            raise RuntimeError("feed_paths needs a committed state with the last committed token uncached")
        paths = [tree.path(leaf) for leaf in tree.leaves()]
        depth = len(paths[0])
        if any(len(p) != depth for p in paths):
            raise ValueError("feed_paths needs every leaf at the same depth")
        device = self.model.device
        extra = extra.to(device=device, dtype=torch.long)
        inputs = torch.cat([torch.tensor(pending, dtype=torch.long, device=device).expand(len(paths), -1),
                            extra[torch.tensor(paths, device=device)]], 1)
        row_of = {}  # node -> the first path (cache row) holding it
        for r, path in enumerate(paths):
            for g in path:
                row_of.setdefault(g, r)
        rows = torch.tensor([0] + [row_of[g] for g in range(tree.size)], device=device)
        cols = torch.tensor([0] + tree.depth.tolist(), device=device)
        t0 = time.perf_counter()
        self.model.select_rows(self.cache, torch.zeros(len(paths), dtype=torch.long))
        logits = self.model.forward(self.cache, inputs, logits_to_keep=depth + 1)  # [K, depth + 1, V]
        self._timed(t0)
        self.calls += 1
        self.fed[inputs.numel()] += 1
        self.committed += len(pending)
        self.tentative = tree.size
        self.tree, self.paths = tree, paths
        return logits[rows, cols]

    # -- several hypotheses, one cache row each ------------------------------------------------
    def feed_rows(self, rows: list[list[int]], entries: list[list[tuple[int, int, tuple[int, ...]]]] | None = None
                  ) -> torch.Tensor:
        """One forward over every cache row, row b holding hypothesis b.

        rows:    each hypothesis' committed tokens, all of one length; each row's uncached ones are fed first
                 (the same number in every row).
        entries: per row, new tentative entries (token, depth, seen): `seen` are the row's tentative offsets
                 it attends to besides itself (its ancestors, fed earlier or earlier in this list). Entry i of
                 a row gets the offset `tentative + i` (this runner's count before the call); its position is
                 the row's length - 1 + depth. Shorter rows are padded with entries that see only committed
                 tokens and are never kept.
        Returns logits [B, k + S, V] (S the most entries per row): when tokens were pending (k = 1), the
        distribution after each row's last committed token, then one per entry.
        """
        if len(rows) != self.rows or self.paths is not None:
            raise RuntimeError(f"{len(rows)} hypotheses fed to a cache of {self.rows} rows")
        length = len(rows[0])
        if any(len(r) != length for r in rows):
            raise ValueError("hypotheses fed together must have one length")
        n_pending = length - self.committed
        if n_pending < 0 or (n_pending and self.tentative):
            raise RuntimeError("committed tokens cannot be fed after tentative entries; commit first")
        entries = entries or [[] for _ in rows]
        width = max(len(e) for e in entries)
        n = n_pending + width
        if n == 0:
            raise RuntimeError("nothing to feed: every committed token is cached and no entries were given")
        b_rows = len(rows)
        tokens = torch.zeros(b_rows, n, dtype=torch.long)
        positions = torch.empty(b_rows, n, dtype=torch.long)
        positions[:, :n_pending] = torch.arange(self.committed, length)
        positions[:, n_pending:] = length  # padding: one step past the row, seeing only its committed tokens
        mask = None
        if width:
            past = self.committed + self.tentative
            mask = torch.zeros(b_rows, n, past + n, dtype=torch.bool)
            # keys: committed tokens at [0, length), tentative offset t at length + t
            mask[:, :n_pending, : self.committed] = True
            mask[:, :n_pending, self.committed : length] = torch.ones(n_pending, n_pending, dtype=torch.bool).tril()
            mask[:, n_pending:, :length] = True
            mask[:, n_pending:, length + self.tentative :] = torch.eye(width, dtype=torch.bool)  # itself
        for b, (row, row_entries) in enumerate(zip(rows, entries, strict=True)):
            tokens[b, :n_pending] = torch.tensor(row[self.committed :], dtype=torch.long)
            for i, (token, depth, seen) in enumerate(row_entries):
                tokens[b, n_pending + i] = token
                positions[b, n_pending + i] = length - 1 + depth
                if seen:
                    mask[b, n_pending + i, [length + t for t in seen]] = True
        device = self.model.device
        t0 = time.perf_counter()
        logits = self.model.forward(self.cache, tokens.to(device), positions.to(device),
                                    None if mask is None else mask.to(device),
                                    logits_to_keep=width + (1 if n_pending else 0))
        self._timed(t0)
        self.calls += 1
        self.fed[tokens.numel()] += 1
        self.committed = length
        self.tentative += width
        return logits

    def commit_rows(self, new_length: int, sources: list[int], kept: list[list[int]]) -> None:
        """The hypotheses are now len(sources) rows of `new_length` committed tokens: new row r continues old
        row sources[r] and keeps its tentative entries kept[r] (a path, depth order; one length for all),
        which become committed; all other tentative entries are dropped. Several new rows may continue one
        old row: each gets its own copy. The last committed token of every row stays uncached."""
        if not sources or len(kept) != len(sources):
            raise ValueError("commit_rows needs one list of kept entries per new row")
        if any(not 0 <= r < self.rows for r in sources):
            raise RuntimeError(f"rows {sources} do not all exist in a cache of {self.rows} rows")
        if len({len(k) for k in kept}) != 1 or any(not 0 <= t < self.tentative for k in kept for t in k):
            raise RuntimeError(f"cannot keep entries {kept}: paths of one length among {self.tentative} fed")
        keep = max(0, min(len(kept[0]), new_length - 1 - self.committed))
        self.model.select_rows(self.cache, torch.tensor(sources, dtype=torch.long))
        if self.tentative:
            index = [list(range(self.committed)) + [self.committed + t for t in k[:keep]] for k in kept]
            self.model.keep_positions(self.cache, torch.tensor(index, dtype=torch.long))
        self.committed += keep
        self.tentative = 0
        self.rows = len(sources)
        self.tree = self.paths = None

    def commit(self, new_length: int, kept: list[int]) -> None:
        """The committed sequence is now `new_length` tokens long; `kept` (tentative offsets, a path down
        the tree that was fed, in depth order) are the accepted entries, which become committed.
        Everything else tentative is dropped. A kept entry that was never fed is an error."""
        if any(not 0 <= k < self.tentative for k in kept):
            raise RuntimeError(f"cannot keep entries {list(kept)}: only {self.tentative} were fed")
        chain_path = self.tree is None and list(kept) == list(range(len(kept)))
        if not chain_path and (self.tree is None or not self.tree.is_root_path(kept)):
            raise RuntimeError(f"kept entries {list(kept)} are not a path down the fed tree")
        # the last committed token stays uncached
        kept = list(kept)[: max(0, new_length - 1 - self.committed)]
        if self.paths is not None:
            row = next((r for r, p in enumerate(self.paths) if p[: len(kept)] == kept), 0)
            self.model.select_rows(self.cache, torch.tensor([row], dtype=torch.long))
            self.model.crop(self.cache, self.committed + len(kept))
        elif kept == list(range(len(kept))):
            self.model.crop(self.cache, self.committed + len(kept))
        else:
            idx = list(range(self.committed)) + [self.committed + k for k in kept]
            self.model.keep_positions(self.cache, torch.tensor(idx, dtype=torch.long))
        self.committed += len(kept)
        self.tentative = 0
        self.tree = self.paths = None


def _bump(counts: list[int], i: int) -> None:
    counts.extend([0] * (i + 1 - len(counts)))
    counts[i] += 1


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
        on_tokens: Callable[[list[int]], bool | None] | None = None,
        cancel: threading.Event | None = None,
    ):
        self.target_model, self.draft_model = target, draft
        self.target = ModelRunner(target)
        self.draft: ModelRunner | None = None  # the draft model's runner, made by `draft_runner` for a drafter
        self.tokens = list(prompt)
        self.prompt_length = len(prompt)
        self.sampling = sampling
        self.max_new_tokens = max_new_tokens
        self.generator = generator
        self.on_tokens = on_tokens  # called with each committed piece; a true return ends the output ("stop")
        self.cancel = cancel  # set from another thread: the output ends at the next check ("cancelled")
        self.stop_tokens = target.stop_tokens
        self.stopped: str | None = "length" if max_new_tokens == 0 else None
        self.counters = {"iterations": 0, "drafted": 0, "nodes": 0, "accepted": 0, "rejections": 0}
        # accepted_lengths[n]: iterations that accepted n drafts; position_tries[i] / position_accepts[i]:
        # iterations that reached draft position i (every earlier one accepted) / accepted it
        self.accepted_lengths: list[int] = []
        self.position_tries: list[int] = []
        self.position_accepts: list[int] = []
        # tree methods: acceptance by depth and sibling rank, per drafter and draw mode (`tree_search`)
        self.ranks: dict = {}
        self.info: dict = {}  # method-specific statistics, merged into the result's stats
        limits = [m.max_length for m in (target, draft) if m is not None and m.max_length is not None]
        self.max_length = min(limits) if limits else None

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    @property
    def done(self) -> bool:
        if self.stopped is None and self.cancel is not None and self.cancel.is_set():
            self.stopped = "cancelled"
        return self.stopped is not None

    def budget(self) -> int:
        """How many more tokens may still be committed (length and context)."""
        left = self.max_new_tokens - len(self.new_tokens)
        if self.max_length is not None:
            left = min(left, self.max_length - len(self.tokens))
        return left

    def draft_depth(self, wanted: int, bonus: bool = True) -> int:
        """How many draft positions this iteration may hold: the bonus token needs a slot too; without a
        bonus, draft up to the budget (at least one)."""
        return min(wanted, self.budget() - 1) if bonus else max(1, min(wanted, self.budget()))

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        return self.sampling.draw(probs, self.generator)

    def draft_runner(self) -> ModelRunner:
        """The draft model's runner, made on first use: the drafter that asks for it feeds and commits it
        (the session only reads its counters)."""
        if self.draft_model is None:
            raise ValueError("this generation has no draft model")
        if self.draft is None:
            self.draft = ModelRunner(self.draft_model)
        return self.draft

    def commit(self, verdict: Verdict, drafted: int = 0, nodes: int | None = None, depth: int | None = None) -> None:
        """Commit one iteration's verdict: append its tokens (cut at EOS and at the budget), count it, and
        commit the target's cache to the accepted path (the drafter commits its own on `accept`).
        `drafted`: draft positions this iteration (for the acceptance rate); `nodes`: proposed nodes, when a
        tree holds more than `drafted`; `depth`: the proposal's depth when it differs from `drafted`
        (several chains)."""
        self.append(verdict.new_tokens)
        self.count(len(verdict.accepted), verdict.rejected, drafted, nodes, depth)
        # accepted nodes the target never scored (its last draft when no bonus token is asked for) stay
        # committed but uncached and are fed with the next step
        runner = self.target
        cached = list(itertools.takewhile(lambda g: g < runner.tentative, verdict.accepted))
        runner.commit(len(self.tokens), cached)

    def count(self, accepted: int, rejected: bool, drafted: int = 0, nodes: int | None = None,
              depth: int | None = None) -> None:
        """Count one iteration: `accepted` of its `drafted` positions passed (see `commit`)."""
        depth = drafted if depth is None else depth
        self.counters["iterations"] += 1
        self.counters["drafted"] += drafted
        self.counters["nodes"] += drafted if nodes is None else nodes
        self.counters["accepted"] += accepted
        self.counters["rejections"] += int(rejected)
        if depth:
            _bump(self.accepted_lengths, accepted)
            for i in range(min(accepted + 1, depth)):
                _bump(self.position_tries, i)
            for i in range(accepted):
                _bump(self.position_accepts, i)

    def append(self, tokens: list[int]) -> None:
        """Append tokens to the output, cutting at EOS and at the budget."""
        tokens = list(tokens)[: self.budget()]
        end = next((i for i, t in enumerate(tokens) if t in self.stop_tokens), None)
        if end is not None:
            tokens = tokens[: end + 1]
            self.stopped = "eos"
        self.tokens.extend(tokens)
        if self.stopped is None and self.budget() <= 0:
            self.stopped = "length" if len(self.new_tokens) >= self.max_new_tokens else "context"
        if self.on_tokens is not None and tokens and self.on_tokens(tokens) and self.stopped is None:
            self.stopped = "stop"


class Hypotheses:
    """Several hypotheses of one length (beam methods): their token rows, joint target log-likelihoods, and
    the ones that ended (with a stop token) on the way. `answer` picks the output."""

    def __init__(self, s: Session):
        self.rows = [list(s.tokens)]
        self.scores = torch.zeros(1, dtype=torch.float64)
        self.start = s.prompt_length
        self.finished: list[tuple[float, list[int]]] = []
        self.max_new_tokens, self.max_length = s.max_new_tokens, s.max_length
        self.cancel = s.cancel

    def room(self) -> int:
        """Tokens that may still be appended to every row (budget and context)."""
        if self.cancel is not None and self.cancel.is_set():
            return 0
        length = len(self.rows[0]) if self.rows else 0
        left = self.max_new_tokens - (length - self.start)
        return left if self.max_length is None else min(left, self.max_length - length)

    def finish(self, score: float, row: list[int]) -> None:
        self.finished.append((float(score), row[self.start :]))

    def answer(self, length_penalty: float) -> list[int]:
        """The output among finished and current hypotheses: the highest log-likelihood / length **
        length_penalty (transformers' name and formula). 1 ranks by the mean log-likelihood per token, the
        perplexity outputs are judged by; 0 by the total, which favours short answers."""
        candidates = self.finished + [(float(sc), r[self.start :]) for sc, r in zip(self.scores.tolist(), self.rows,
                                                                                   strict=True)]
        return max(candidates, key=lambda c: c[0] / max(1, len(c[1])) ** length_penalty)[1]
