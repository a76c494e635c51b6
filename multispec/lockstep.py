"""Lockstep batches: `ar` and `sd` chains for many sequences at once, the work besides forwards done for all rows
together, with tensor operations.

Each iteration, over the rows that decode (B rows, a chain of at most G drafts each):

choose:  each row's drafter option and length: the chain it was asked for, or with `gamma=auto` the row's length
         controller's choice priced as the batch's iteration (`multispec.batchload.RowLoad`), zero included;
propose: the draft steps the chains of every row that drafts with it at once: one batched forward per draft
         position; the drafts of all rows come from one warp of their logits [B, V] and one inverse-CDF at per-row
         uniforms; a row that copies (`lookup`, `suffix`, `hybrid`) takes its copy, one-hot draft rows;
score:   one target forward over every row's pending tokens and drafts (`HFModel.forward_rows`, packed);
verify:  the chain rule for every row at once: ratio tests [B, G], accepted prefixes by a cumulative product,
         the residual or bonus rows [B, V] drawn together;
commit:  per row, its output, counters and caches (`Session.commit`); rows that ended leave, waiting prompts join.

Glossary: `depth` [B], each row's drafts this iteration (0: a plain target step); `drafts` [B, G] (padded with 0);
`draft_rows` [B, G, V], the draft's warped rows the drafts were drawn from; `target_rows` [B, G + 1, V], the
target's after the pending token and after each draft; `accepted` [B], each row's accepted drafts.

Why a row's output is the one `generate` gives it alone: row b reads only its own logits, its own draft rows and its
own random stream; each draw takes from row b's generator what `generate` takes for it alone, in the same order (its
drafts' uniforms, then its ratio tests', then the residual's or bonus token's), and the batched forwards give a
row the bits it gets alone (`HFModel.forward_rows`). A joining prompt, but its last token, is fed beside the
decoding rows: in one piece through the fused attention, as `generate` feeds it, where it holds at most
`PREFILL_TOKENS` tokens; a longer one in chunks of `PREFILL_CHUNK` at fixed offsets, so that the decoding rows wait
for a chunk, not a whole prompt (its bits then depend on its length alone, not on the batch, but in a reduced
precision they can differ from `generate`'s single pass).

With `gamma=auto` a row's choices depend on the other rows (the batch's prices), so its output follows the target's
law but is not the draws `generate` makes alone; a row alone in the batch prices as `generate` does.

Models without batched forwards (the exact test models) run the same loop with one forward per row, so the checker
runs on it. `generate_batch` takes this path for `ar` and for `sd` chains (`runs_in_lockstep`); other methods run
in `multispec.batching`'s threads.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from .batchload import BatchPrices, RowLoad
from .drafting import DRAFTERS, Drafter, make_drafter
from .drafting.length import DraftLength
from .drafting.shape import OVERHEAD_PRIOR, PLAIN_OVERHEAD_PRIOR
from .engine import Entries, ModelRunner, Session, Step
from .models.base import ModelView
from .models.static import RowKV
from .verify import Verdict
from .verify.chain import RESIDUAL_EPS
from .warp import Sampling, argmax, categorical_each

PREFILL_CHUNK = 64
PREFILL_TOKENS = 256


def batchable(model) -> bool:
    """Whether `model` decodes sequences in one batched forward (a static cache and `forward_rows`)."""
    return getattr(model, "static", False) and hasattr(model, "forward_rows")


class OnRow(ModelView):
    """A model seen through one row of a batch cache: `new_cache` is that row (`static.RowKV`); the rest is the
    model's. Its forwards are not run through it: the batch runs every row's in one (`forward_rows`)."""

    def __init__(self, model, cache: RowKV):
        super().__init__(model)
        self._cache = cache

    def prepare(self) -> None:
        return None  # a batch's steps run eagerly: nothing to settle

    def new_cache(self):
        return self._cache


@dataclass(frozen=True)
class _Choice:
    """A row's drafts for one iteration: `depth` of them (0: a plain target step); `copied`: the tokens a copying
    drafter proposed (None: the draft model drafts them); `key`: the drafter option (its acceptance record)."""

    depth: int = 0
    copied: list[int] | None = None
    key: str | None = None


@dataclass
class Ask:
    """One sequence to decode in a lockstep batch: its prompt, budget, seed and warp, and its method's chain
    (`runs_in_lockstep`'s arguments: gamma, drafter, min_ngram, max_ngram); `on_tokens`, `cancel` and `score` as
    `generate` takes them; `tag`: the caller's (`generate_batch`: the prompt's index)."""

    prompt: list[int]
    max_new_tokens: int
    seed: int
    sampling: Sampling
    chain: dict
    on_tokens: Callable[[list[int]], bool | None] | None = None
    cancel: object = None
    score: bool = False
    tag: object = None


@dataclass
class _Row:
    """One sequence of the batch: what was asked, its batch row and its session."""

    ask: Ask
    slot: int
    session: Session
    started: float
    fed: int = 0  # prompt tokens fed so far (all but the last are fed before it decodes)
    logprob: float = 0.0  # the output's log-probability under the target, unwarped (`score`)
    shared: dict = field(default_factory=lambda: {"target": 0.0, "draft": 0.0})  # its share of the forwards
    drafter: Drafter | None = None  # its options each iteration (the draft model's chain, a copy)
    controller: DraftLength | None = None  # `gamma=auto`'s
    used: dict = field(default_factory=dict)  # `gamma=auto`: iterations per drafter kind ("none": a plain step)
    failed: list = field(default_factory=list)  # what its `on_tokens` raised (it ended the row; `finish` raises it)

    @property
    def prefilling(self) -> bool:
        return self.fed < self.session.prompt_length - 1

    @property
    def gamma(self) -> int | str:
        return self.ask.chain["gamma"]


class Lockstep(BatchPrices):
    """A lockstep batch of one model pair (see the module note). Each row brings its own warp and chain (`Ask`), so
    requests with different sampling, `gamma` and drafters decode together.

    Args:
        target, draft: the models (draft None where no row drafts with it: `ar`, copying drafters alone).
        rows: sequences decoded at once.
        capacity: entries a row holds (prompt, output and one iteration's drafts).
        caches: per model, the batch caches to decode in (a `Batcher` shares its own: its rows and these are
            disjoint); None: made here, for models with batched forwards.

    `run(...)` decodes a list of prompts (`generate_batch`); a driver that takes requests as they come (the
    `Batcher`) calls `join`, `step` and `finish` itself.
    """

    def __init__(self, target, draft, rows: int, capacity: int, caches: dict | None = None):
        self.models = {"target": target, "draft": draft}
        self.rows, self.capacity = rows, capacity
        self._active: set[int] = set()  # the rows in the batch (`RowLoad` prices the others' choices)
        self._init_prices()
        self._costs = None  # `gamma=auto`: one sequence's cost curves of the target and the draft (`generate`'s)
        given = {role: m for role, m in self.models.items() if m is not None}
        if caches is not None:
            self.caches = caches
        elif all(batchable(m) for m in given.values()):
            self.caches = {role: m.new_batch_cache(rows, capacity + PREFILL_CHUNK + 64) for role, m in given.items()}
        else:
            self.caches = {}
        self.stats = {"forwards": 0, "rows": 0, "seconds": 0.0, "prefill_chunks": 0, "prefill_tokens": 0}
        self.stats["other_seconds"] = 0.0  # between forwards: drawing, verifying, committing, joining

    def run(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        seeds: list[int],
        sampling: Sampling,
        chain: dict,
        on_result: Callable[[int, object], None] | None = None,
        on_tokens: Callable[[list[int]], bool | None] | None = None,
        cancel=None,
        score: bool = False,
    ) -> list:
        """Decode every prompt (prompt i with seed `seeds[i]`), each with `sampling` and `chain`: one `Result` per
        prompt, in order. `on_result(i, result)` as each ends; `on_tokens`, `cancel`, `score` as `generate` takes
        them, for every row (`score`'s log-probabilities read from the target's logits of the decoding forwards:
        no forward of their own)."""
        waiting, free = deque(range(len(prompts))), list(range(self.rows))
        active: list[_Row] = []
        results: list = [None] * len(prompts)
        while waiting or active:
            while waiting and free:
                i = waiting.popleft()
                ask = Ask(list(prompts[i]), max_new_tokens, seeds[i], sampling, chain, on_tokens, cancel, score, i)
                active.append(self.join(ask, free.pop(0)))
            for row in self.step(active):
                active.remove(row)
                results[row.ask.tag] = self.finish(row)
                free.append(row.slot)
                free.sort()  # the lowest first: the batched forwards span rows 0 .. highest active
                if on_result is not None:
                    on_result(row.ask.tag, results[row.ask.tag])
        return results

    def step(self, active: list[_Row]) -> list[_Row]:
        """One iteration over the rows `active` (joined, not finished): returns those that ended."""
        t0 = time.perf_counter()
        forwards = self.stats["seconds"]
        self._iteration(active)
        self.stats["other_seconds"] += time.perf_counter() - t0 - (self.stats["seconds"] - forwards)
        return [r for r in active if r.session.done]

    def finish(self, row: _Row):
        """A row that ended: its `Result` (as `generate` gives it); its batch row is free again. Raises what its
        `on_tokens` raised, as `generate` would."""
        from .api import session_stats
        from .likelihood import perplexity
        from .result import Result

        if row.failed:
            self._leave(row.slot)
            raise row.failed[0]
        s = row.session
        stats = session_stats(s, time.perf_counter() - row.started)
        stats["queue_seconds"] = 0.0
        stats["batch_target_share_seconds"] = row.shared["target"]
        stats["batch_draft_share_seconds"] = row.shared["draft"]
        stats["batch_waiting_seconds"] = 0.0
        stats["fallbacks"] = []
        if row.controller is not None:
            stats["drafter_iterations"] = row.used
        if row.ask.score:
            stats["mean_logprob"] = row.logprob / len(s.new_tokens) if s.new_tokens else None
            stats["perplexity"] = perplexity([stats["mean_logprob"]])
        self._leave(row.slot)
        return Result(s.new_tokens, self.models["target"].decode(s.new_tokens), stats, s.tokens[: s.prompt_length])

    # -- rows joining and leaving ----------------------------------------------------------------------------------
    def join(self, ask: Ask, slot: int) -> _Row:
        """Start decoding `ask` in batch row `slot` (free): its prompt is fed with the next iterations."""
        chain = ask.chain
        gamma, drafter = chain["gamma"], chain.get("drafter", "model")
        if drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {drafter!r}")
        uses_draft = bool(gamma) and drafter in ("model", "hybrid") and self.models["draft"] is not None
        if bool(gamma) and drafter == "model" and not uses_draft:
            raise ValueError("a chain of the draft model needs a draft model")
        on = {}
        for role, model in self.models.items():
            if model is None or (role == "draft" and not uses_draft):
                on[role] = None
            elif self.caches:
                cache = RowKV(self.caches[role], slot)
                cache.capacity = self.capacity  # the rest of the batch cache's room is for a step's padding
                on[role] = OnRow(model, cache)
            else:
                on[role] = model  # a cache of its own, fed one row at a time
        generator = torch.Generator(device=self.models["target"].device)
        generator.manual_seed(ask.seed)
        failed: list[BaseException] = []

        def on_tokens(tokens: list[int], call=ask.on_tokens):
            # a caller's callback that raises ends its own row, not the iteration of every row
            try:
                return call(tokens)
            except Exception as e:  # noqa: BLE001 - raised again by `finish`, to this row's caller
                failed.append(e)
                return True

        s = Session(
            on["target"], on["draft"], list(ask.prompt), ask.sampling, ask.max_new_tokens, generator,
            on_tokens if ask.on_tokens is not None else None, ask.cancel,
        )  # fmt: skip
        row = _Row(ask, slot, s, time.perf_counter(), failed=failed)
        self._active.add(slot)
        if gamma:
            lo, hi = chain.get("min_ngram", 1), chain.get("max_ngram", 3)
            row.drafter = make_drafter(drafter, s, tree=False, min_ngram=lo, max_ngram=hi)
        if gamma == "auto":  # priced as `sd` prices it alone, against the batch's iteration in a batch
            if self._costs is None:
                from .models.cost import forward_cost

                draft = self.models["draft"]
                self._costs = (
                    forward_cost(self.models["target"]),
                    forward_cost(draft, batch_invariant=False) if draft is not None else None,
                )
            row.controller = DraftLength(
                self._costs[0],
                self._costs[1] if uses_draft else None,
                overhead=OVERHEAD_PRIOR,
                plain_overhead=PLAIN_OVERHEAD_PRIOR,
                load=RowLoad(self, slot) if self.caches else None,
            )
        return row

    def _leave(self, slot: int) -> None:
        self._active.discard(slot)
        self._forget(slot)
        for cache in self.caches.values():
            view = getattr(cache, "views", {}).pop(slot, None)
            if view is not None:
                view.length = 0

    # -- one iteration -----------------------------------------------------------------------------------------------
    def _iteration(self, active: list[_Row]) -> None:
        chunks = self._chunks([r for r in active if r.prefilling and not r.session.done])
        rows = [r for r in active if not r.prefilling and not r.session.done]
        choices = [self._choose(r) for r in rows]
        depth = [c.depth for c in choices]
        drafts, draft_rows = self._propose(rows, choices, chunks)
        # score: every decoding row's pending tokens and drafts, and the prompts' chunks, in one target forward
        steps = []
        for r, d in zip(rows, depth, strict=True):
            entries = Entries.chain(drafts[len(steps), :d]) if d else None
            steps.append((r, r.session.target, r.session.target.step([r.session.tokens], entries)))
        logits = self._forward("target", steps + chunks["target"])
        for r, _, step in chunks["target"]:
            r.fed = step.length
        if rows:
            self._verify_and_commit(rows, choices, drafts, draft_rows, logits[: len(rows)])

    def _choose(self, r: _Row) -> _Choice:
        """Row `r`'s drafts this iteration, within the room its row has left (`Session.draft_depth`): the first
        option of its drafter (`hybrid`: a copy where one exists, else the model's chain), or with `gamma=auto`
        its controller's pick (`DraftLength.plan`), as `sd` chooses them alone."""
        if not r.gamma:
            return _Choice()
        s = r.session
        longest = r.controller.max_gamma if r.controller is not None else r.gamma
        room = max(0, s.draft_depth(longest))
        if room == 0:
            return _Choice()
        options = r.drafter.options(s.tokens, room)
        if r.controller is None:
            option, length = (options[0], options[0].length) if options else (None, 0)
        else:
            plan = r.controller.plan(options, len(s.tokens), len(s.tokens) - s.target.committed)
            option, length = plan.option, plan.length
            kind = option.key.split(":")[0] if option is not None else "none"
            r.used[kind] = r.used.get(kind, 0) + 1
        if option is None or length == 0:
            return _Choice()
        if option.runner is not None:
            return _Choice(length, None, option.key)
        proposal = option.make(length)  # a copy: fixed tokens, no forward
        return _Choice(proposal.size, proposal.tokens.tolist(), option.key)

    def _chunks(self, prefilling: list[_Row]) -> dict[str, list[tuple[_Row, ModelRunner, Step]]]:
        """The next piece of each joining prompt (all but its last token), per model: (row, runner, step)."""
        out: dict[str, list] = {role: [] for role in self.models}
        budget = PREFILL_TOKENS
        for r in prefilling:
            start, fed = r.fed, r.session.prompt_length - 1
            # in one piece where it fits a forward (the bits `generate` gives its prompt), else in chunks
            end = min(fed, (start // PREFILL_CHUNK + 1) * PREFILL_CHUNK)
            if start == 0 and fed <= PREFILL_TOKENS:
                end = fed
            if end - start > budget and out["target"]:
                break
            budget -= end - start
            part = r.session.tokens[:end]
            for role in (role for role in self.models if getattr(r.session, role) is not None):
                runner = getattr(r.session, role)
                step = runner.step([part])
                if start == 0:  # the first piece through the fused kernel, as `generate` feeds all but the last
                    step = replace(step, fused=end)
                out[role].append((r, runner, step))
            self.stats["prefill_chunks"] += 1
            self.stats["prefill_tokens"] += end - start
        return out

    def _forward(self, role: str, steps: list[tuple[_Row, ModelRunner, Step]]) -> list[torch.Tensor]:
        """One forward of a model over the rows' steps: each row's kept logits [keep, V], in order."""
        if not steps:
            return []
        model = self.models[role]
        t0 = time.perf_counter()
        if self.caches:
            feeds = [
                (r.slot, runner.cache, step.tokens[0], step.positions[0], None, step.keep, step.fused)
                for r, runner, step in steps
            ]
            out = model.forward_rows(self.caches[role], feeds)
        else:  # models without batched forwards: one forward per row, the rest of the loop as in a batch
            out = [runner.run(step)[0] for _, runner, step in steps]
        seconds = time.perf_counter() - t0
        tokens = sum(step.tokens.shape[-1] for _, _, step in steps)
        if self.caches:  # the batch's prices (`gamma=auto`): the gap between forwards, the curve's scale
            self._timed(role, t0, seconds, tokens, decoding=all(not r.prefilling for r, _, _ in steps))
        for r, runner, step in steps:
            runner.ran(step, seconds)
            if step.length < r.session.prompt_length:  # a prompt's piece: counted with its first step's call, as
                runner.calls -= 1  # `generate` feeds the prompt in that call
            r.shared[role] += seconds * step.tokens.shape[-1] / tokens
        self.stats["forwards"] += 1
        self.stats["rows"] += len(steps)
        self.stats["seconds"] += seconds
        return out

    def _propose(self, rows: list[_Row], choices: list[_Choice], chunks) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every row's chain: a copy as its drafter gave it, or `depth` drafts of the draft model, one draft forward
        per position over every row drafting with it (the prompts' chunks ride in the first). Returns drafts [B, G]
        and, when sampling, the draft rows [B, G, V] they were drawn from (one-hot rows for a copy)."""
        width = max((c.depth for c in choices), default=0)
        drafts = torch.zeros(len(rows), width, dtype=torch.long)
        draft_rows = None
        if width and any(not r.session.sampling.greedy for r in rows):
            vocab = self.models["target"].vocab_size
            draft_rows = torch.zeros(len(rows), width, vocab, dtype=torch.float32)
        copying = [b for b, c in enumerate(choices) if c.copied]
        if copying:
            for b in copying:
                drafts[b, : choices[b].depth] = torch.tensor(choices[b].copied)
            if draft_rows is not None:  # a fixed token's draft row is one-hot on it
                for b in copying:
                    d = choices[b].depth
                    draft_rows[b, torch.arange(d), drafts[b, :d]] = 1.0
        depth = [0 if c.copied else c.depth for c in choices]  # the draft model's positions per row
        drafting = [b for b, d in enumerate(depth) if d > 0]
        steps = [
            (rows[b], rows[b].session.draft, rows[b].session.draft.step([rows[b].session.tokens])) for b in drafting
        ]
        logits = self._forward("draft", steps + chunks["draft"])[: len(steps)]
        last = torch.stack([x[-1] for x in logits]) if logits else None
        for i in range(max(depth, default=0)):
            live = [j for j, b in enumerate(drafting) if depth[b] > i]  # indices into `drafting` still drafting
            at = last[live] if len(live) < last.shape[0] else last
            tokens = torch.zeros(len(live), dtype=torch.long)
            for sampling, part in _by_sampling([rows[drafting[j]] for j in live]).items():
                logits_part = at if len(part) == len(live) else at[part]
                if sampling.greedy:  # one-hot rows: the verdict reads the target's argmax alone
                    tokens[part] = argmax(logits_part)
                else:
                    probs = sampling.probs(logits_part)
                    tokens[part] = categorical_each(probs, [rows[drafting[live[k]]].session.generator for k in part])
                    draft_rows[[drafting[live[k]] for k in part], i] = probs.to(draft_rows.dtype)
            drafts[[drafting[j] for j in live], i] = tokens
            feeding = [(j, k) for k, j in enumerate(live) if depth[drafting[j]] > i + 1]  # the last is never fed
            if not feeding:
                continue
            steps = []
            for j, k in feeding:
                r = rows[drafting[j]]
                steps.append(
                    (r, r.session.draft, r.session.draft.step([r.session.tokens], Entries.chain(tokens[k : k + 1])))
                )
            out = self._forward("draft", steps)
            last = last.clone()
            last[[j for j, _ in feeding]] = torch.stack([x[-1] for x in out])
        return drafts, draft_rows

    def _verify_and_commit(self, rows, choices: list[_Choice], drafts, draft_rows, logits) -> None:
        """The chain rule for every row at once, rows of one warp together (`_chain_rule`), then each row's commit;
        a controller hears its row's acceptance."""
        n, width = len(rows), drafts.shape[1]
        depth = torch.tensor([c.depth for c in choices])
        vocab = logits[0].shape[-1]
        target_logits = logits[0].new_zeros(n, width + 1, vocab)
        for b, x in enumerate(logits):  # (rows with fewer drafts are padded; their padding is never read)
            target_logits[b, : x.shape[0]] = x
        accepted = torch.zeros(n, dtype=torch.long)
        nxt = torch.zeros(n, dtype=torch.long)
        for sampling, part in _by_sampling(rows).items():
            if len(part) == n:  # (one warp for the whole batch, the usual case: no copies of the rows)
                accepted, nxt = _chain_rule(
                    sampling, drafts, draft_rows, target_logits, depth, [r.session.generator for r in rows]
                )
                break
            index = torch.tensor(part)
            accepted[index], nxt[index] = _chain_rule(
                sampling,
                drafts[index],
                draft_rows[index] if draft_rows is not None else None,
                target_logits[index],
                depth[index],
                [rows[b].session.generator for b in part],
            )
        logprobs = None
        if any(r.ask.score for r in rows):  # log target(token | prefix), unwarped, of each token a row may commit
            chosen = torch.cat([drafts, drafts.new_zeros(n, 1)], 1)  # its drafts, then the next token
            chosen[torch.arange(n), accepted] = nxt
            picked = target_logits.gather(-1, chosen[..., None])[..., 0].double()
            logprobs = picked - torch.logsumexp(target_logits.double(), -1)  # [B, G + 1]
        for b, r in enumerate(rows):
            s, d, k = r.session, int(depth[b]), int(accepted[b])
            before = len(s.new_tokens)
            if d == 0:
                s.commit(Verdict.token(int(nxt[b])))
            else:
                context = len(s.tokens)
                verdict = Verdict(tuple(range(k)), tuple(drafts[b, :k].tolist()), int(nxt[b]), k < d)
                s.commit(verdict, drafted=d)
                if r.controller is not None:
                    r.controller.observe(choices[b].key, d, k)
                if choices[b].copied is None:  # the draft keeps the accepted drafts it was fed (all but the last)
                    s.draft.commit(context + len(verdict.new_tokens), [list(range(min(k, d - 1)))])
            if logprobs is not None and r.ask.score:  # the tokens committed (a stop or the budget may cut it short)
                r.logprob += float(logprobs[b, : len(s.new_tokens) - before].sum())


def _by_sampling(rows: list[_Row]) -> dict[Sampling, list[int]]:
    """The rows' indices grouped by their warp, in order: rows of one warp are drawn and verified together."""
    groups: dict[Sampling, list[int]] = {}
    for b, r in enumerate(rows):
        groups.setdefault(r.session.sampling, []).append(b)
    return groups


def _chain_rule(
    sampling: Sampling,
    drafts: torch.Tensor,
    draft_rows: torch.Tensor | None,
    target_logits: torch.Tensor,
    depth: torch.Tensor,
    generators: list[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify.chain.speculative_verify` for B rows of one warp at once, each row's draws from its own generator in
    the order `speculative_verify` takes them (its drafts' uniforms, then the residual's or bonus token's).

    Args:
        sampling: the rows' warp.
        drafts: [B, G] each row's drafts (padded past its depth).
        draft_rows: [B, G, V] the warped draft rows they were drawn from (one-hot for copies); None when greedy.
        target_logits: [B, G + 1, V] the target's after the pending token and after each draft.
        depth: [B] each row's drafts (0: a plain target step).
        generators: B, one per row.

    Returns:
        accepted [B] (drafts accepted) and next [B] (the token after them: a residual's, the bonus, or a step's).
    """
    n, width = drafts.shape
    positions = torch.arange(width)
    if sampling.greedy:
        best = argmax(target_logits)  # [B, G + 1]
        passed = (drafts == best[:, :width]) & (positions < depth[:, None])
        accepted = passed.int().cumprod(1).sum(1)
        return accepted, best.gather(1, accepted[:, None])[:, 0]
    target_rows = sampling.probs(target_logits)  # [B, G + 1, V]
    if width:
        # each row's uniforms, as `speculative_verify` draws them (none for a row without drafts)
        uniforms = torch.ones(n, width, dtype=target_rows.dtype)
        for b, d in enumerate(depth.tolist()):
            if d:
                uniforms[b, :d] = torch.rand(d, generator=generators[b], dtype=target_rows.dtype)
        on_target = target_rows[:, :width].gather(-1, drafts[..., None])[..., 0]
        on_draft = draft_rows.gather(-1, drafts[..., None])[..., 0]
        passed = (uniforms * on_draft < on_target) & (positions < depth[:, None])
        accepted = passed.int().cumprod(1).sum(1)
    else:
        accepted = torch.zeros(n, dtype=torch.long)
    every = torch.arange(n)
    at = target_rows[every, accepted]  # [B, V]: the target after the accepted drafts
    rejected = accepted < depth
    if bool(rejected.any()):
        residual = (at - draft_rows[every, accepted.clamp_max(width - 1)]).clamp_min(0)
        mass = residual.sum(-1)
        at = torch.where((rejected & (mass > RESIDUAL_EPS))[:, None], residual, at)
    return accepted, categorical_each(at, generators)


def runs_in_lockstep(target, draft, method: str, params: dict, sampling: Sampling) -> dict | None:
    """`Lockstep`'s arguments for `method` with `params` (gamma, drafter, n-gram bounds) when it runs in a lockstep
    batch, else None: `ar`, and `sd` chains (any drafter, a fixed `gamma` or "auto") with a bonus token, no
    confidence stop, the whole draft vocabulary and no feature-level head, on models that batch alike (both with
    batched forwards, or neither)."""
    if method == "ar":
        return {"gamma": 0}
    if method != "sd":
        return None
    plain = {"bonus": True, "confidence": 0.0, "draft_vocab": None}
    if any(params.get(k, v) != v for k, v in plain.items()):
        return None
    drafter = params.get("drafter", "model")
    gamma = params.get("gamma")
    uses_draft = drafter in ("model", "hybrid") and draft is not None
    if drafter not in DRAFTERS or (drafter == "model" and draft is None):
        return None
    if not (isinstance(gamma, int) or gamma == "auto"):
        return None
    if uses_draft and (getattr(draft, "reads_target_features", False) or batchable(draft) != batchable(target)):
        return None
    return {
        "gamma": gamma,
        "drafter": drafter,
        "min_ngram": params.get("min_ngram", 1),
        "max_ngram": params.get("max_ngram", 3),
    }
