"""Drafting as proposers: an object that, given the session and a shape, proposes tokens on a tree.

`Proposer.propose(session, shape)` returns a `Proposal`: the tree, its tokens, and the warped draft
distributions each node was drawn from, keyed by parent (row 0 the root, row 1 + g node g). `shape` is a
tuple of branching factors (a k-config; a chain of g drafts is (1,) * g); a proposer may return a smaller
tree (a chain that stops early). `observe(verdict)` is the feedback hook, called after every
verification, for proposers that adapt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .engine import Session
from .trees import TokenTree
from .verify.beam import beam_distribution
from .verify.verdict import Verdict


@dataclass
class Proposal:
    tree: TokenTree
    tokens: torch.Tensor  # [N] token ids, node order
    draft_probs: torch.Tensor  # [R, V]: row 0 the root, row 1 + g node g, for every node with children
    live: torch.Tensor | None = None  # [N] bool: False for padding that must never be accepted; None: all live
    fixed: torch.Tensor | None = None  # [N] bool: nodes proposed deterministically (one-hot draft); None: none
    logq: torch.Tensor | None = None  # [N] a chain's cumulative joint draft log-probability (joint methods)
    draft_entries: list[int] | None = None  # each node's entry in the draft cache's tree, when they differ


@dataclass
class Option:
    """One way to draft this iteration, for a controller that picks the length: `key` names the drafter
    (and what it matched) for its acceptance statistics, `length` is the most drafts it can give, `runner` the
    draft model's runner when drafting costs its forwards (None: free), and `make(g)` builds the chain of g."""
    key: str
    length: int
    runner: object | None
    make: object  # Callable[[int], Proposal]


def empty_proposal(s: Session) -> Proposal:
    """Nothing proposed: the iteration is a plain target step."""
    device = s.target_model.device
    return Proposal(TokenTree.chain(0), torch.empty(0, dtype=torch.long, device=device),
                    torch.empty(0, s.target_model.vocab_size, device=device))


class Proposer:
    def propose(self, session: Session, shape: tuple[int, ...]) -> Proposal:
        raise NotImplementedError

    def observe(self, verdict: Verdict) -> None:
        """Called with each verdict on this proposer's proposal."""

    def options(self, session: Session, depth: int) -> list[Option]:
        """The chains this proposer could draft now, up to `depth` tokens (see `Option`)."""
        return [Option(getattr(self, "name", type(self).__name__), depth, session.draft,
                       lambda g: self.propose(session, (1,) * g))]


class DraftChain(Proposer):
    """The draft model samples a chain, one draft forward per token; with `confidence` the chain ends after
    the first token whose probability under the draft's plain softmax (not the warped one, which is
    one-hot when greedy) is below it. With `fallback` (BiLD's fallback threshold) it ends after a token drawn
    from a distribution whose largest probability is below it: the warped draft's, or its plain softmax
    when greedy. The stop is decided by the draft alone from tokens already drawn, so verification stays
    exact."""

    name = "model"

    def __init__(self, confidence: float = 0.0, fallback: float = 0.0):
        self.confidence, self.fallback = confidence, fallback

    def propose(self, s: Session, shape: tuple[int, ...]) -> Proposal:
        g = len(shape)
        device = s.target_model.device
        if g == 0:
            return empty_proposal(s)
        probs, tokens = [], []
        logits = s.draft.feed(s.tokens)
        for i in range(g):
            q = s.sampling.probs(logits[-1])
            token = s.sample(q)
            probs.append(q)
            tokens.append(token)
            if self.confidence > 0 and torch.softmax(logits[-1].float(), -1)[token] < self.confidence:
                break
            if self.fallback > 0 and self._peak(s, q, logits[-1]) < self.fallback:
                break
            if i + 1 < g:  # the last draft is never fed to the draft model
                logits = s.draft.feed(s.tokens, token.reshape(1))
        return Proposal(TokenTree.chain(len(tokens)), torch.stack(tokens).to(device), torch.stack(probs).to(device))


    @staticmethod
    def _peak(s: Session, q: torch.Tensor, logits: torch.Tensor) -> float:
        return float((torch.softmax(logits.float(), -1) if s.sampling.greedy else q).max())


class DraftTree(Proposer):
    """The draft model expands a full tree of the given k-config level by level, one draft forward per
    level (seed 004 §3.8): every node of depth d gets k_{d+1} children drawn from the draft's warped
    distribution after its path, i.i.d. (`replacement`) or one after another without replacement, kept
    in draw order. At temperature 0 the children are the draft's top-k tokens, best first, whatever
    `replacement` says (i.i.d. argmax draws would all be the same token); they are verified against the
    softmax of those k logits (seed 004 §3.6), which with a one-hot target accepts the target's argmax."""

    name = "model"

    def __init__(self, replacement: bool = False):
        self.replacement = replacement
        self._trees: dict[tuple[int, ...], TokenTree] = {}

    def tree(self, shape: tuple[int, ...]) -> TokenTree:
        if shape not in self._trees:
            self._trees[shape] = TokenTree.from_branching(shape)
        return self._trees[shape]

    def propose(self, s: Session, shape: tuple[int, ...]) -> Proposal:
        tree = self.tree(shape)
        device = s.target_model.device
        logits = s.draft.feed(s.tokens)[-1:]  # [1, V]: the root
        rows, tokens, live = [], [], []
        parent_live = torch.ones(1, dtype=torch.bool, device=logits.device)
        for d, k in enumerate(shape, start=1):
            children, alive, stored = sample_children(s, logits, k, self.replacement)
            rows.append(stored)
            flat = children.reshape(-1)
            tokens.append(flat)
            parent_live = (alive & parent_live[:, None]).reshape(-1)
            live.append(parent_live)
            if d < len(shape):  # the deepest level is never fed to the draft model
                logits = s.draft.feed(s.tokens, flat, tree=tree, nodes=tree.level(d))[-flat.numel():]
        live_all = torch.cat(live)
        return Proposal(tree, torch.cat(tokens).to(device), torch.cat(rows).to(device),
                        None if bool(live_all.all()) else live_all.to(device))


def sample_children(s: Session, logits: torch.Tensor, k: int, replacement: bool):
    """k children for each of n nodes from their draft logits [n, V]: the session's sampling, or the top-k
    at temperature 0. Returns (tokens [n, k], live [n, k] bool, the draft rows to verify against [n, V])."""
    if s.sampling.greedy:
        return top_children(logits, k)
    probs = s.sampling.probs(logits)
    return (*draw_children(probs, k, replacement, s.generator), probs)


def draw_children(probs: torch.Tensor, k: int, replacement: bool, generator: torch.Generator | None = None):
    """k children per row of probs [n, V]: i.i.d., or one after another without replacement in draw order.

    Returns (tokens [n, k], live [n, k] bool). Without replacement from a row whose support is smaller than
    k, the slots past the support are padding (a copy of the first child, live False): seed 004 §8.11(b),
    exact because Algorithm 2 is exact for any number of candidates up to the support.
    """
    n, vocab = probs.shape
    if replacement:
        tokens = torch.multinomial(probs, k, replacement=True, generator=generator)
        return tokens, torch.ones_like(tokens, dtype=torch.bool)
    # an exponential race (arrival time Exp(1) / q), arrivals kept in time order, is the sequential draw
    # order without replacement; tokens with q = 0 never arrive
    uniform = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=probs.dtype)
    arrival = -torch.log1p(-uniform) / probs
    first = torch.topk(arrival, min(k, vocab), dim=-1, largest=False, sorted=True).indices
    live = probs.gather(-1, first) > 0
    return _pad(torch.where(live, first, first[:, :1]), live, k)


def top_children(logits: torch.Tensor, k: int):
    """Temperature 0: the k best tokens per row, best first, and the softmax of their logits as the draft
    row (seed 004 §3.6). Returns (tokens [n, k], live [n, k], rows [n, V])."""
    top = torch.topk(logits, min(k, logits.shape[-1]), dim=-1)
    rows = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    rows.scatter_(-1, top.indices, torch.softmax(top.values.float(), -1))
    return (*_pad(top.indices, torch.ones_like(top.indices, dtype=torch.bool), k), rows)


def _pad(tokens: torch.Tensor, live: torch.Tensor, k: int):
    """Pad [n, m] to k columns with dead copies of the first child (k above the vocabulary)."""
    n, m = tokens.shape
    if m == k:
        return tokens, live
    return (torch.cat([tokens, tokens[:, :1].expand(n, k - m)], 1),
            torch.cat([live, torch.zeros(n, k - m, dtype=torch.bool, device=live.device)], 1))


class BeamDraft(Proposer):
    """Beam drafting (seed 000 §2.3, seed 001 §2.3): W beams for g steps on the draft model, the best
    beam by joint draft likelihood proposed as a chain.

    The beams grow as a tree in one cache row: the beams of depth d are nodes whose parents are beams of
    depth d - 1, and one draft forward per depth scores them with an ancestor-only mask (no copies of the
    cache per beam). Every extension (beam b, token v) is scored by the joint log-likelihood
    s_b + log q(v | beam b); sampling (MTAD) draws W extensions without replacement from the softmax of
    those scores over all W x V pairs (Eq. 2 of seed 000), on the warped draft rows; `deterministic` (MJSD's
    beam decoding) keeps the W best under the raw draft. A draw that runs out of support keeps fewer beams.

    `propose` returns the chain with `logq` [g]: the cumulative joint log-probability of the chosen path,
    under the warped draft (`raw=False`) or its plain softmax (`raw=True`), re-indexed with the beams (the
    legacy code's un-re-indexed scores are a known bug); and `draft_entries`: each chain node's entry in
    the draft's cache tree, so that commit keeps the right ones.
    """

    name = "beam"

    def __init__(self, width: int, deterministic: bool = False, raw: bool = False):
        self.width, self.deterministic, self.raw = width, deterministic, raw

    def propose(self, s: Session, shape: tuple[int, ...]) -> Proposal:
        g = len(shape)
        device = s.target_model.device
        if g == 0:
            return empty_proposal(s)
        logits = s.draft.feed(s.tokens)[-1:]  # [1, V]: the root
        parents: list[int] = []  # beam tree, breadth first
        tokens: list[int] = []
        score_of: list[float] = []  # beam score of each node (what ranks the beams)
        logq_of: list[float] = []  # cumulative log q of each node's path (what verification reads)
        beams = [-1]  # the nodes that are live beams (the root to start)
        for depth in range(1, g + 1):
            logq_rows = self._logq(s, logits)  # [B, V]
            base = torch.tensor([0.0 if b < 0 else score_of[b] for b in beams], dtype=torch.float64)
            base_q = torch.tensor([0.0 if b < 0 else logq_of[b] for b in beams], dtype=torch.float64)
            # [B, V] per-token log-scores that rank the beams (beam sampling on the warped draft: logq itself)
            ranking = logq_rows if self._ranks_by_logq(s) else self._ranking(s, logits)
            joint = base[:, None].to(ranking.device) + ranking  # [B, V]
            picks = self._pick(s, joint.reshape(-1))
            start = len(tokens)
            vocab = joint.shape[-1]
            for flat in picks.tolist():
                b, v = divmod(flat, vocab)
                parents.append(beams[b])
                tokens.append(v)
                score_of.append(float(joint[b, v]))
                logq_of.append(float(base_q[b] + logq_rows[b, v]))
            beams = list(range(start, len(tokens)))
            if depth < g:  # the deepest level is never fed to the draft model
                tree = TokenTree.from_parents(parents)
                new = torch.tensor(tokens[start:], dtype=torch.long)
                logits = s.draft.feed(s.tokens, new, tree=tree, nodes=slice(start, len(tokens)))[-len(beams):]
        best = max(beams, key=lambda n: score_of[n])
        path = []
        node = best
        while node >= 0:
            path.append(node)
            node = parents[node]
        path.reverse()
        chain = torch.tensor([tokens[n] for n in path], dtype=torch.long, device=device)
        logq = torch.tensor([logq_of[n] for n in path], dtype=torch.float64, device=device)
        return Proposal(TokenTree.chain(g), chain, torch.empty(0, s.target_model.vocab_size, device=device),
                        logq=logq, draft_entries=path)

    def _logq(self, s: Session, logits: torch.Tensor) -> torch.Tensor:
        """log q of each token under the distribution the ratio uses: warped, or the plain softmax."""
        if self.raw:
            return torch.log_softmax(logits.double(), -1)
        return torch.log(s.sampling.probs(logits).double())

    def _ranks_by_logq(self, s: Session) -> bool:
        return not self.raw and not (self.deterministic or s.sampling.greedy)

    def _ranking(self, s: Session, logits: torch.Tensor) -> torch.Tensor:
        """Beam decoding ranks by the raw draft (seed 001 §2.3), beam sampling by the warped one (seed 000)."""
        if self.deterministic or s.sampling.greedy:
            return torch.log_softmax(logits.double(), -1)
        return torch.log(s.sampling.probs(logits).double())

    def _pick(self, s: Session, joint: torch.Tensor) -> torch.Tensor:
        """W flat (beam, token) indices: the best (deterministic, or greedy sampling), or drawn without
        replacement with weights softmax(joint); fewer when the support is smaller than W."""
        support = torch.isfinite(joint).nonzero().flatten()  # the warped rows leave few candidates
        k = min(self.width, support.numel())
        if self.deterministic or s.sampling.greedy:
            return torch.topk(joint, k).indices
        weights = torch.softmax(joint[support], -1)
        return support[torch.multinomial(weights.float(), k, replacement=False, generator=s.generator)]


@dataclass
class ForestLayer:
    parents: torch.Tensor  # [m] each node's parent: a position in the previous layer (layer 1: an input beam)
    tokens: torch.Tensor  # [m]
    draft_beam: torch.Tensor  # [P * V] float64: the draft's beam distribution the layer was drawn from


@dataclass
class Forest:
    """A draft forest over several input beams (seed 003 §3.2, step 1), layer by layer."""
    layers: list[ForestLayer]
    roots: list[list[int]]  # per layer, per node: the input beam (cache row) it descends from
    draft_paths: list[list[list[int]]]  # per layer, per node: the draft cache offsets of its fed path


class ForestDraft:
    """Beam sampling on the draft from every input beam: layer l holds `width` nodes drawn i.i.d. (with
    replacement, kept in draw order) from the draft's beam distribution over (node of layer l - 1, token):
    the input beams' `scores` plus the raw draft log-probabilities along the path, warped jointly. The
    session passes the beams' joint target log-likelihoods as `scores` (the authors' code starts from 0):
    any weights keep the method exact, these make the draft's first layer agree with the target's where
    the models agree. Every node of a layer is a parent at the next, whatever the target will say of it.
    Each node lives in its input beam's draft cache row, as a tree with an ancestor-only mask; one draft
    forward per layer but the last, over all rows."""

    def propose(self, s: Session, rows: list[list[int]], width: int, depth: int,
                scores: torch.Tensor | None = None) -> Forest:
        runner = s.draft
        logits = runner.feed_rows(rows)[:, -1]  # [B, V]: after each input beam
        scores = (torch.zeros(len(rows), dtype=torch.float64) if scores is None else scores.double()).to(logits.device)
        paths: list[list[int]] = [[] for _ in rows]
        roots = list(range(len(rows)))
        forest = Forest([], [], [])
        for d in range(1, depth + 1):
            logq = torch.log_softmax(logits.double(), -1)  # [P, V]
            vocab = logq.shape[-1]
            beam = beam_distribution(scores, logq, s.sampling)
            picks = torch.multinomial(beam.float(), width, replacement=True, generator=s.generator)
            at, tokens = picks // vocab, picks % vocab
            scores = scores[at] + logq[at, tokens]
            roots = [roots[a] for a in at.tolist()]
            forest.layers.append(ForestLayer(at, tokens, beam))
            parent_paths = [paths[a] for a in at.tolist()]
            paths = parent_paths  # the deepest layer is never fed to the draft model
            if d < depth:
                entries: list[list] = [[] for _ in rows]
                paths, (row, index) = grow_rows(entries, roots, tokens.tolist(), parent_paths, d, runner.tentative)
                logits = runner.feed_rows(rows, entries)[row, index]  # [width, V]
            forest.roots.append(roots)
            forest.draft_paths.append(paths)
        return forest


def grow_rows(entries: list[list], roots: list[int], tokens: list[int], parent_paths: list[list[int]], depth: int,
              base: int = 0) -> tuple[list[list[int]], tuple[torch.Tensor, torch.Tensor]]:
    """Lay one forest layer into per-row entry lists for `ModelRunner.feed_rows`: node j goes to row
    roots[j] at `depth`, seeing its parent's path parent_paths[j]. `base`: the runner's tentative entries
    before the call (offsets count from there). Returns each node's path of cache offsets (itself last)
    and where its logits come out of `feed_rows`: (row [m], index among the row's entries [m])."""
    paths, row, index = [], [], []
    for root, token, path in zip(roots, tokens, parent_paths, strict=True):
        entries[root].append((token, depth, tuple(path)))
        row.append(root)
        index.append(len(entries[root]) - 1)
        paths.append([*path, base + index[-1]])
    return paths, (torch.tensor(row, dtype=torch.long), torch.tensor(index, dtype=torch.long))
