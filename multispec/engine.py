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
from dataclasses import dataclass

import torch

from .models.base import LanguageModel
from .trees import TokenTree
from .verify.verdict import Verdict
from .warp import Sampling


@dataclass(frozen=True)
class Entries:
    """New tentative entries for one forward: S per cache row (B rows).

    tokens: [B, S] long.
    depth:  [B, S] long, >= 1: an entry's position is its row's committed length - 1 + depth.
    sees:   [B, S, T + S] bool: besides every committed token, the tentative entries each one attends to: the
            T the cache held before the call, then these S; itself included.
    `depth` and `sees` None: each row's entries continue the chain of its tentative entries (a causal mask,
    which the forward needs no mask tensor for).
    """

    tokens: torch.Tensor
    depth: torch.Tensor | None = None
    sees: torch.Tensor | None = None
    # the nodes [start, stop) of a tree, when the entries are those (one row): the runner then keeps what the
    # tentative entries see as a prefix of the tree instead of building it feed by feed
    of_tree: TokenTree | None = None
    start: int = 0

    @property
    def is_chain(self) -> bool:
        return self.sees is None

    @classmethod
    def chain(cls, tokens: torch.Tensor | list[int]) -> Entries:
        """Tokens [S] (one row) or [B, S] that continue each row's chain."""
        t = torch.as_tensor(tokens, dtype=torch.long)
        return cls(t.reshape(1, -1) if t.dim() < 2 else t)

    @classmethod
    def tree(cls, tree: TokenTree, tokens: torch.Tensor, nodes: slice | None = None) -> Entries:
        """The nodes `nodes` (default all) of `tree` in one row, their `tokens` [len(nodes)]; the tentative
        entries before them must be the tree's earlier nodes, in node order."""
        nodes = nodes or slice(0, tree.size)
        t = torch.as_tensor(tokens, dtype=torch.long).reshape(1, -1)
        if tree.is_chain:
            return cls(t)
        return cls(t, *tree.layout(nodes), of_tree=tree, start=nodes.start or 0)

    @classmethod
    def lists(cls, rows: list[list[tuple[int, int, tuple[int, ...]]]], tentative: int) -> Entries:
        """Per row, entries (token, depth, seen): `seen` are the row's tentative offsets it attends to besides
        itself (entries cached before, or earlier in its list); entry i of a row gets the offset
        `tentative + i`. Shorter rows are padded with entries at depth 1 that see no tentative entry."""
        width = max(len(r) for r in rows)
        b = len(rows)
        tokens = torch.zeros(b, width, dtype=torch.long)
        depth = torch.ones(b, width, dtype=torch.long)
        sees = torch.zeros(b, width, tentative + width, dtype=torch.bool)
        sees[:, :, tentative:] = torch.eye(width, dtype=torch.bool)
        for r, row in enumerate(rows):
            for i, (token, d, seen) in enumerate(row):
                tokens[r, i], depth[r, i] = token, d
                if seen:
                    sees[r, i, list(seen)] = True
        return cls(tokens, depth, sees)


@dataclass
class Step:
    """One runner's forward, as `ModelRunner.step` makes it: B cache rows, n tokens each.

    tokens: [B, n] the uncached committed tokens, then the new entries; positions: [B, n]; mask: [B, n, held + n]
    bool or None (causal); keep: logits kept, the last `keep` per row; fused: a prompt's first tokens, fed into
    an empty cache (`LanguageModel.forward`'s `fused_prefix`); length: the committed tokens once it has run;
    entries: the new entries (None: none)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None
    keep: int
    fused: int
    length: int
    entries: Entries | None


class ModelRunner:
    """One model's KV cache, in `rows` cache rows (one per hypothesis), and what it holds: `committed` tokens of
    every row, then `tentative` entries (proposed nodes not yet verified). `feed` scores new tokens in one
    forward; `commit` keeps the accepted entries (and chooses, repeats or reorders rows) and drops the rest."""

    def __init__(self, model: LanguageModel, batch_invariant: bool = True):
        self.model = model
        self.batch_invariant = batch_invariant  # passed to every forward (a draft's runner: False)
        if batch_invariant:
            model.prepare()  # a target's kernels, which its cache's storage follows
        self.cache = model.new_cache()
        self.committed = 0  # committed tokens held in the cache
        self.tentative = 0  # proposed entries after them
        self.rows = 1  # cache rows, one per hypothesis
        self.calls = 0
        self.fed: Counter[int] = Counter()  # forwards by the tokens they fed (rows x tokens per row)
        self.seconds = 0.0  # in forwards, one-time compiles included
        self.one_time = 0.0  # of which: compiling forwards for new shapes
        self.prefill = 0.0  # of which: the first forward (the prompt), compiles not included
        self._compiled_seen = getattr(model, "compile_seconds", 0.0)
        # the tentative entries' depths [B, T] and visibility among themselves [B, T, T]; None while they form
        # one chain in every row
        self._depth: torch.Tensor | None = None
        self._sees: torch.Tensor | None = None
        # or, while the tentative entries are the first nodes of one tree (fed in node order), that tree: their
        # depths and visibility are its own
        self._tree: TokenTree | None = None

    def feed(self, rows: list[list[int]], entries: Entries | None = None) -> torch.Tensor:
        """One forward over every cache row: row b's uncached committed tokens (rows[b] is its committed
        sequence; all of one length), then its new `entries`.

        Returns logits [B, k + S, V]: when committed tokens were pending (k = 1), the distribution after each
        row's last committed token, then one row per entry.
        """
        step = self.step(rows, entries)
        t0 = time.perf_counter()
        logits = self.run(step)
        if getattr(self.model.device, "type", None) == "cuda":
            # a GPU forward returns before its kernels finish: without this, the wait would be counted in
            # whatever reads the logits first (the rule's time), not in the forward's
            torch.cuda.synchronize(self.model.device)
        self.ran(step, time.perf_counter() - t0)
        return logits

    def run(self, step: Step) -> torch.Tensor:
        """The model's forward of `step` on this runner's cache: logits [B, keep, V] (`ran` accounts for it)."""
        return self.model.forward(
            self.cache,
            step.tokens,
            step.positions,
            step.mask,
            logits_to_keep=step.keep,
            fused_prefix=step.fused,
            batch_invariant=self.batch_invariant,
        )

    def step(self, rows: list[list[int]], entries: Entries | None = None) -> Step:
        """What `feed(rows, entries)` hands the model's forward, checked, without running it: a batch of many
        sequences (`multispec.lockstep`) runs many runners' steps in one forward, then tells each (`ran`)."""
        if len(rows) != self.rows:
            raise RuntimeError(f"{len(rows)} hypotheses fed to a cache of {self.rows} rows")
        length = len(rows[0])
        if any(len(r) != length for r in rows):
            raise ValueError("hypotheses fed together must have one length")
        n_pending = length - self.committed
        if n_pending < 0:
            raise RuntimeError(f"the cache holds {self.committed} committed tokens, more than the {length} given")
        if n_pending and self.tentative:
            raise RuntimeError("committed tokens cannot be fed after tentative entries; commit first")
        s = 0 if entries is None else entries.tokens.shape[1]
        if entries is not None:
            if entries.tokens.shape[0] != len(rows):
                raise ValueError(f"entries for {entries.tokens.shape[0]} rows fed with {len(rows)} hypotheses")
            if entries.sees is not None and entries.sees.shape[-1] != self.tentative + s:
                raise RuntimeError(
                    f"entries that see {entries.sees.shape[-1] - s} tentative entries fed with {self.tentative} cached"
                )
            if entries.is_chain and (self._sees is not None or self._tree is not None):
                raise RuntimeError("a chain can only continue a chain of tentative entries")
        n = n_pending + s
        if n == 0:
            raise RuntimeError("nothing to feed: every committed token is cached and no entries were given")
        device = self.model.device
        parts = []  # tokens on the model's device (drafts may live there), positions on the CPU
        if n_pending:
            parts.append(torch.tensor([r[self.committed :] for r in rows], dtype=torch.long, device=device))
        if s:
            parts.append(entries.tokens.to(device))
        tokens = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
        if entries is None or entries.is_chain:  # one run of positions (pending tokens come with no tentative)
            start = self.committed if n_pending else length + self.tentative
            positions = torch.arange(start, start + n).expand(len(rows), -1)
        else:
            positions = length - 1 + entries.depth
            if n_pending:
                positions = torch.cat([torch.arange(self.committed, length).expand(len(rows), -1), positions], 1)
        mask = None if not s or entries.is_chain else _mask(n_pending, self.committed, entries.sees)
        # one-time work done outside forwards (a kernel decided when a cost curve was looked up) is not this one's
        self._compiled_seen = getattr(self.model, "compile_seconds", 0.0)
        return Step(
            tokens,
            positions.to(device),
            None if mask is None else mask.to(device),
            # a prompt but its last token: logits not kept, and fed alike by every method
            keep=s + (1 if n_pending else 0),
            fused=n_pending - 1 if self.committed == 0 else 0,
            length=length,
            entries=entries,
        )

    def ran(self, step: Step, seconds: float) -> None:
        """Account for `step` run in a forward of `seconds`: the cache now holds its tokens."""
        self.seconds += seconds
        compiled = getattr(self.model, "compile_seconds", 0.0)
        self.one_time += compiled - self._compiled_seen
        if self.committed == 0:
            self.prefill += seconds - (compiled - self._compiled_seen)
        self._compiled_seen = compiled
        self.calls += 1
        self.fed[step.tokens.numel()] += 1
        self.committed = step.length
        if step.entries is not None and step.entries.tokens.shape[1]:
            self._record(step.entries)
            self.tentative += step.entries.tokens.shape[1]

    def _record(self, entries: Entries) -> None:
        """Extend the tentative entries' depths and visibility with `entries` (fed, not yet counted)."""
        if entries.is_chain and self._sees is None:
            return
        b, s = entries.tokens.shape
        t = self.tentative
        if (
            entries.of_tree is not None
            and entries.start == t
            and self._sees is None
            and (self._tree is entries.of_tree or t == 0)
        ):
            self._tree = entries.of_tree  # the tree's nodes [0, t + s): nothing to build
            return
        self._spell_out()
        old_depth, old_sees = self._depth, self._sees
        if old_sees is None:  # a chain so far
            old_depth = torch.arange(1, t + 1).expand(b, -1)
            old_sees = torch.ones(t, t, dtype=torch.bool).tril().expand(b, -1, -1)
        sees = torch.zeros(b, t + s, t + s, dtype=torch.bool)
        sees[:, :t, :t] = old_sees
        sees[:, t:] = entries.sees
        self._depth = torch.cat([old_depth, entries.depth], 1)
        self._sees = sees

    def _spell_out(self) -> None:
        """Depths and visibility of the tentative entries as tensors, where a tree prefix stood for them."""
        if self._tree is not None:
            self._depth, self._sees = self._tree.layout(slice(0, self.tentative))
            self._tree = None

    def _is_path(self, row: int, kept: list[int]) -> bool:
        """Whether the tentative entries `kept` of cache row `row` are a path from the committed tokens down."""
        if any(not 0 <= k < self.tentative for k in kept):
            return False
        if self._tree is not None:  # each node's parent is the one before it, the first a child of the root
            parents = self._tree.parent_list
            return all(parents[k] == (kept[i - 1] if i else -1) for i, k in enumerate(kept))
        if self._sees is None:
            return kept == list(range(len(kept)))
        if not kept:
            return True
        # entries see their ancestors: an entry at depth i + 1 that sees one at depth i is its child
        index = torch.tensor(kept)
        return torch.equal(self._depth[row, index], torch.arange(1, len(kept) + 1)) and bool(
            self._sees[row, index[1:], index[:-1]].all()
        )

    def commit(self, new_length: int, kept: list[list[int]] | None = None, sources: list[int] | None = None) -> None:
        """The committed sequences are now `new_length` tokens long: new row r continues old row `sources[r]`
        (default: the rows as they are; rows may repeat, reorder or be dropped, a repeated row is copied) and
        keeps the tentative entries `kept[r]` of it (a path down what was fed, in depth order; one length for
        every row; default: none), which become committed. Every other tentative entry is dropped. The last
        committed token stays uncached: kept entries past `new_length - 1` are dropped too."""
        sources = list(range(self.rows)) if sources is None else list(sources)
        kept = [[] for _ in sources] if kept is None else [list(k) for k in kept]
        if not sources or len(kept) != len(sources):
            raise ValueError("commit needs one list of kept entries per new row")
        if any(not 0 <= r < self.rows for r in sources):
            raise RuntimeError(f"rows {sources} do not all exist in a cache of {self.rows} rows")
        if len({len(k) for k in kept}) != 1:
            raise RuntimeError(f"cannot keep entries {kept}: every row keeps a path of one length")
        for r, k in zip(sources, kept, strict=True):
            if not self._is_path(r, k):
                raise RuntimeError(f"kept entries {k} are not a path down the {self.tentative} tentative entries fed")
        keep = max(0, min(len(kept[0]), new_length - 1 - self.committed))
        kept = [k[:keep] for k in kept]
        if sources != list(range(self.rows)):
            self.model.select_rows(self.cache, torch.tensor(sources, dtype=torch.long))
        if self.tentative:
            if all(k == list(range(keep)) for k in kept):
                self.model.crop(self.cache, self.committed + keep)
            else:
                prefix = list(range(self.committed))
                index = torch.tensor([prefix + [self.committed + t for t in k] for k in kept], dtype=torch.long)
                self.model.keep_positions(self.cache, index[0] if len(kept) == 1 else index)
        self.committed += keep
        self.tentative = 0
        self.rows = len(sources)
        self._depth = self._sees = None
        self._tree = None


def _bump(counts: list[int], i: int) -> None:
    counts.extend([0] * (i + 1 - len(counts)))
    counts[i] += 1


def _mask(n_pending: int, n_cached: int, sees: torch.Tensor) -> torch.Tensor:
    """Bool mask [B, n_pending + S, n_cached + n_pending + T + S]: pending committed tokens see the committed
    ones causally; each entry sees every committed token and the tentative entries `sees` [B, S, T + S] marks."""
    b, s, tentative = sees.shape
    committed = n_cached + n_pending
    mask = torch.zeros(b, n_pending + s, committed + tentative, dtype=torch.bool)
    if n_pending:
        mask[:, :n_pending, :committed] = torch.ones(n_pending, committed, dtype=torch.bool).tril(n_cached)
    mask[:, n_pending:, :committed] = True
    mask[:, n_pending:, committed:] = sees
    return mask


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
        if getattr(draft, "reads_target_features", False):  # a feature-level draft (`models.eagle`)
            from .models.features import FeatureTarget

            target = FeatureTarget(target, draft.feature_layers)
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

    def one_time_seconds(self) -> float:
        """Seconds the forwards have spent compiling for new shapes so far (one-time costs, not decoding)."""
        return self.target.one_time + (self.draft.one_time if self.draft is not None else 0.0)

    def forward_seconds(self) -> tuple[float, float]:
        """Seconds in target and in draft forwards so far, compiles left out."""
        return (
            self.target.seconds - self.target.one_time,
            self.draft.seconds - self.draft.one_time if self.draft is not None else 0.0,
        )

    def reduce_draft(self, n: int) -> None:
        """Draft from the draft's n most frequent tokens (`draft_vocab`, `multispec.models.vocab`), before any
        drafter has made the draft's runner."""
        if self.draft is not None:
            raise RuntimeError("the draft's vocabulary is set before its runner is made")
        if self.draft_model is not None:
            from .models.vocab import reduce_vocab

            self.draft_model = reduce_vocab(self.draft_model, n)

    def draft_runner(self) -> ModelRunner:
        """The draft model's runner, made on first use: the drafter that asks for it feeds and commits it
        (the session only reads its counters)."""
        if self.draft_model is None:
            raise ValueError("this generation has no draft model")
        if self.draft is None:
            self.draft = ModelRunner(self.draft_model, batch_invariant=False)  # only the target's logits decide
            if getattr(self.draft_model, "reads_target_features", False):
                self.draft_model.attach(self.draft.cache, self.target.cache)
        return self.draft

    def commit(
        self,
        verdict: Verdict,
        drafted: int = 0,
        nodes: int | None = None,
        depth: int | None = None,
        paths: list[list[int]] | None = None,
    ) -> None:
        """Commit one iteration's verdict: append its tokens (cut at EOS and at the budget), count it, and
        commit the target's cache to the accepted path (the drafter commits its own on `accept`).
        `drafted`: draft positions this iteration (for the acceptance rate); `nodes`: proposed nodes, when a
        tree holds more than `drafted`; `depth`: the proposal's depth when it differs from `drafted`
        (several chains); `paths`: the tree's path each target cache row holds, when it was scored one row per
        path."""
        self.append(verdict.new_tokens)
        self.count(len(verdict.accepted), verdict.rejected, drafted, nodes, depth)
        # accepted nodes the target never scored (its last draft when no bonus token is asked for) stay
        # committed but uncached and are fed with the next step
        runner = self.target
        if paths is None:
            cached = list(itertools.takewhile(lambda g: g < runner.tentative, verdict.accepted))
            runner.commit(len(self.tokens), [cached])
        else:  # one cache row per path: keep the row that holds the accepted path
            accepted = list(verdict.accepted)
            row = next(r for r, path in enumerate(paths) if path[: len(accepted)] == accepted)
            runner.commit(len(self.tokens), [list(range(len(accepted)))], sources=[row])

    def count(
        self, accepted: int, rejected: bool, drafted: int = 0, nodes: int | None = None, depth: int | None = None
    ) -> None:
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
        candidates = self.finished + [
            (float(sc), r[self.start :]) for sc, r in zip(self.scores.tolist(), self.rows, strict=True)
        ]
        return max(candidates, key=lambda c: c[0] / max(1, len(c[1])) ** length_penalty)[1]
