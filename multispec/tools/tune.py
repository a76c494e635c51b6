"""`multispec tune`: which method, which tree, on this machine, for these prompts, with the evidence.

1. cost:     the forward cost curves of target and draft (`multispec.models.cost`, cached per machine).
2. probe:    `mcsd` on the prompts, alternating a wide probe tree and a 4-draft chain, measures acceptance by
             depth and sibling rank (`multispec.tree_search`), the per-iteration work besides forwards
             (fitted as a + b * nodes from the two shapes), and how much the forwards of trees and of chains
             cost against the curve (a tree's forward goes through an explicit mask); one `mcsd` run on a
             one-node chain gives, with the 4-draft chain on the same prompt, a chain's own work line (a
             chain skips a tree's masks and bookkeeping); `ar` runs on a few prompts give its own per-step
             figures, and `sd` runs of two lengths, on the chain probes' prompts, its chains' (sd runs them
             another way). Every run's length goes into the expected output length, over which the
             prompt's forward is spread.
3. predict:  every candidate plan - `ar`, `sd` chains, the MCSD paper's k-configs, optimal trees of several
             sizes, `tree=auto` - gets expected tokens per target call and seconds per iteration, hence
             predicted tokens/s.
4. measure:  the best few predictions, the best `sd` chain and `ar` run on the same prompts; the fastest
             measured is the plan.
5. write:    a plan file (JSON; a chosen tree goes beside it) that `generate --plan` and `bench --plan` read.
"""

from __future__ import annotations

import datetime
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..api import generate
from ..drafting.shape import AUTO_MAX_DEPTH, AUTO_MAX_NODES, DRAFT_MARGIN, replans
from ..models.base import LanguageModel
from ..models.cost import ForwardCost, forward_cost, padded_tokens
from ..params import parse_method, read_json
from ..tree_search import (
    RankAcceptance,
    TreeTable,
    fastest_tree,
    iteration_seconds,
    reach_of,
    search_tree,
    tree_value,
)
from ..trees import TokenTree
from .bench.prompts import Prompt

PLAN_FORMAT = "multispec-plan/1"
# k-configs the MCSD paper reports as best in some setting (its Tables 2, 3, 6, 7), and small ones
PAPER_K_CONFIGS = (
    "2x1x1",
    "2x2x1",
    "4x1x1",
    "4x2x1",
    "8x1",
    "4x4",
    "8x2",
    "4x2x2",
    "2x2x2x1x1",
    "16x1x1",
    "4x2x2x1",
    "16x2",
    "8x2x1x1",
    "8x2x2",
    "4x2x2x1x1",
)
OPTIMAL_SIZES = (4, 8, 16, 32, 64)
PROBE_RATES = (0.7, 0.4, 0.3, 0.25, 0.2, 0.2, 0.2, 0.2)  # only shapes the probe tree: wide near the top
PROBE_NODES, PROBE_DEPTH, PROBE_CHAIN = 48, 8, 4
AR_PROMPTS = 3  # ar runs that price ar
WARM_UP_TOKENS = 8


def probe_tree() -> TokenTree:
    rates = np.tile(np.array(PROBE_RATES), (PROBE_DEPTH, 1))
    return TreeTable(reach_of(rates), PROBE_NODES, PROBE_DEPTH).tree(PROBE_NODES, PROBE_DEPTH)


@dataclass
class Candidate:
    label: str  # a method spec, or a description where the plan holds a tree
    method: str
    params: dict
    tree: TokenTree | None  # the drafted shape (None: ar)
    tokens: float  # predicted tokens per target call
    seconds: float  # predicted seconds per iteration
    prefill: float = 0.0  # predicted seconds of the prompt's forwards (target and draft), once per generation
    new_tokens: float = 1.0  # expected new tokens per generation, over which the prefill is spread
    measured_tokens_per_second: float | None = None
    measured_block_efficiency: float | None = None

    @property
    def predicted_tokens_per_second(self) -> float:
        return 1.0 / (self.seconds / self.tokens + self.prefill / max(1.0, self.new_tokens))

    def row(self) -> dict:
        return {
            "plan": self.label,
            "tree": self.tree.describe() if self.tree is not None and self.tree.size else "-",
            "predicted_tokens_per_call": round(self.tokens, 3),
            "predicted_tokens_per_second": round(self.predicted_tokens_per_second, 2),
            # the parts: an iteration's seconds, and the prompt's forwards spread over the expected output
            "predicted_seconds_per_iteration": round(self.seconds, 6),
            "predicted_prefill_seconds": round(self.prefill, 5),
            "expected_new_tokens": round(self.new_tokens, 1),
            "measured_tokens_per_second": _round(self.measured_tokens_per_second),
            "measured_block_efficiency": _round(self.measured_block_efficiency),
        }


def _round(x):
    return None if x is None else round(x, 3)


@dataclass
class TuneResult:
    candidates: list[Candidate]
    chosen: Candidate
    ranks: RankAcceptance
    overhead: tuple[float, float]  # seconds per iteration: a + b * nodes
    ar_overhead: float
    context: int
    settings: dict
    probe: dict = field(default_factory=dict)


def _run(target, draft, prompts: list[Prompt], method: str, params: dict, settings: dict, first: int = 0) -> list[dict]:
    """Stats of `method` on `prompts`; the i-th prompt's seed is the settings' + first + i."""
    return [
        generate(
            target,
            draft,
            p.text,
            method=method,
            max_new_tokens=settings["max_new_tokens"],
            temperature=settings["temperature"],
            top_k=settings["top_k"],
            top_p=settings["top_p"],
            seed=settings["seed"] + first + i,
            chat=settings["chat"],
            score=False,
            **params,
        ).stats
        for i, p in enumerate(prompts)
    ]


def tune(
    target: LanguageModel,
    draft: LanguageModel,
    prompts: list[Prompt],
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    max_new_tokens: int = 128,
    seed: int = 0,
    chat: bool = True,
    measure: int = 3,
    say: Callable[[str], None] = lambda _: None,
) -> TuneResult:
    """Steps 1-4 of the module note on `prompts` (at least 2)."""
    if draft is None:
        raise ValueError("tune compares drafting plans: it needs a draft model")
    if len(prompts) < 2:
        raise ValueError(f"tune needs at least 2 prompts (half probe the tree, half a chain), got {len(prompts)}")
    if measure < 1:
        raise ValueError(f"--measure must be >= 1, got {measure}")
    settings = {
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "chat": chat,
    }
    replacement = False
    say("measuring forward costs (once per machine) ...")
    # a compiled model's curve is measured in this process: its kernels are autotuned per process
    target_cost = forward_cost(target, here=padded_tokens(target) > 0)
    # a tree's forward goes through an explicit mask, which has its own curve (cached per machine, as tree=auto
    # reads it): trees are priced on it, chains and plain steps on the causal one
    tree_cost = forward_cost(target, masked=True)
    draft_cost = forward_cost(draft, here=padded_tokens(draft) > 0, batch_invariant=False)
    routes = {
        role: {str(k): v for k, v in getattr(m, "bucket_route", {}).items()}
        for role, m in (("target", target), ("draft", draft))
    }
    if any(routes.values()):
        say(f"buckets routed to a larger one whose compiled step ran faster: {routes}")

    say(f"probing acceptance by sibling rank on {len(prompts)} prompts ...")
    wide = probe_tree()
    # first calls pay for lazy initialisation (a step's package loaded, its kernels' first run): ar's first run
    # after the probes took 11.1 ms a step against 8.0 on the same prompt later. Every kind the probe times
    # runs a few tokens first, untimed, as the bench's warm-up does
    _warm_up(
        target,
        draft,
        prompts[0],
        [("ar", {}), ("sd", {"gamma": PROBE_CHAIN, "drafter": "model"}), ("sd", {"gamma": 1, "drafter": "model"})]
        + [
            ("mcsd", {"tree": shape, "replacement": replacement})
            for shape in (wide, TokenTree.chain(PROBE_CHAIN), TokenTree.chain(1))
        ],
        settings,
    )
    prompt_tokens = [len(target.encode(p.text, chat=chat)) if isinstance(p.text, str) else len(p.text) for p in prompts]
    ranks, runs = RankAcceptance(), []
    for i, prompt in enumerate(prompts):
        shape = wide if i % 2 == 0 else TokenTree.chain(PROBE_CHAIN)
        st = _run(target, draft, [prompt], "mcsd", {"tree": shape, "replacement": replacement}, settings)[0]
        for counts in st.get("rank_acceptance", {}).values():
            if counts["tries"]:
                ranks.merge(RankAcceptance.from_dict(counts))
        runs.append((shape, st, prompt_tokens[i]))
    overhead = _fit_overhead(
        [
            (st["draft_nodes"] / st["iterations"], st["other_seconds"] / st["iterations"])
            for _, st, _ in runs
            if st["iterations"]
        ]
    )
    # a chain's own work, a + b * nodes through a one-node chain and the probe's chain on the same prompt
    short = _run(
        target, draft, prompts[1:2], "mcsd", {"tree": TokenTree.chain(1), "replacement": replacement}, settings
    )[0]
    chain_overhead = _fit_overhead(
        [
            (st["draft_nodes"] / st["iterations"], st["other_seconds"] / st["iterations"])
            for st in (short, runs[1][1])
            if st["iterations"]
        ]
    )
    # ar's own per-step work and forward factor, pooled over a few prompts: one prompt's run (about a second)
    # caught the host's speed of that moment, and its factor ranged over 0.78-1.20 between categories
    ar_prompts = prompts[:AR_PROMPTS]
    # (stats, prompt tokens), as the first prompts' tokens
    plain_runs = list(zip(_run(target, draft, ar_prompts, "ar", {}, settings), prompt_tokens, strict=False))
    ar_overhead = sum(st["other_seconds"] for st, _ in plain_runs) / max(
        1, sum(st["target_calls"] for st, _ in plain_runs)
    )
    # sd runs chains another way than mcsd (causal forwards, the chain rule, no tree bookkeeping): its own
    # per-iteration work line and forward factors, from sd runs on the chain probes' prompts at two lengths
    # (mcsd's chain probes overstated them; one run's factor swung by a fifth from prompt to prompt at T = 1)
    sd_runs = []
    for j, i in enumerate(range(1, len(prompts), 2)):
        gamma = PROBE_CHAIN if j % 2 == 0 else 1
        st = _run(target, draft, [prompts[i]], "sd", {"gamma": gamma, "drafter": "model"}, settings)[0]
        sd_runs.append((TokenTree.chain(gamma), st, prompt_tokens[i]))
    sd_factors = _forward_factors(sd_runs, target_cost, draft_cost)["chain"]
    sd_base, sd_per_node = _fit_overhead(
        [(shape.size, st["other_seconds"] / st["iterations"]) for shape, st, _ in sd_runs if st["iterations"]]
    )
    if len({shape.size for shape, _, _ in sd_runs}) < 2:  # one length only (two prompts): mcsd's slope
        sd_per_node = overhead[1]
        sd_base = max(0.0, sd_base - sd_per_node * PROBE_CHAIN)
    # the expected length of an output is the target's (every method here samples its law, or its greedy
    # path): pooled over every run so far. At T = 1 one run's length is a coin toss (8 to 128 tokens on the same
    # prompt), and the prompt's forward is spread over it: the probe runs alone put rag's prefill at 1.5x its
    # share
    all_runs = (
        [(st, n) for _, st, n in runs] + [(short, prompt_tokens[1])] + plain_runs + [(st, n) for _, st, n in sd_runs]
    )
    new_tokens = float(np.mean([st["new_tokens"] for st, _ in all_runs]))
    mean_prompt = float(np.mean(prompt_tokens))
    context = int(mean_prompt + new_tokens / 2)
    # the prompt's forwards are paid once per generation; each kind's own (a tree's holds its first tree, ar
    # feeds no draft), per prompt token over its runs, at the prompts' mean length
    prefill = _prefill_seconds([(st, n) for _, st, n in runs], mean_prompt)
    sd_prefill = _prefill_seconds([(st, n) for _, st, n in sd_runs], mean_prompt)
    ar_prefill = _prefill_seconds(plain_runs, mean_prompt)
    factors = _forward_factors(runs, target_cost, draft_cost, tree_cost)
    ar_factor = _forward_factors([(TokenTree.chain(0), st, n) for st, n in plain_runs], target_cost, draft_cost)[
        "chain"
    ][0]

    rates = ranks.rates(AUTO_MAX_DEPTH)
    reach = reach_of(rates)
    table = TreeTable(reach, AUTO_MAX_NODES, AUTO_MAX_DEPTH)

    def seconds(tree: TokenTree) -> float:
        on_target, on_draft = factors["chain" if tree.is_chain else "tree"]
        curve = target_cost if tree.is_chain else tree_cost
        work = chain_overhead if tree.is_chain else overhead
        return iteration_seconds(
            tuple(tree.widths()),
            curve.scaled(on_target),
            draft_cost.scaled(on_draft),
            context,
            work[0] + work[1] * tree.size,
        )

    def sd_seconds(chain: TokenTree) -> float:
        return iteration_seconds(
            tuple(chain.widths()),
            target_cost.scaled(sd_factors[0]),
            draft_cost.scaled(sd_factors[1]),
            context,
            sd_base + sd_per_node * chain.size,
        )

    candidates = [
        Candidate("ar", "ar", {}, None, 1.0, ar_factor * target_cost(1, context) + ar_overhead, ar_prefill, new_tokens)
    ]
    for g in range(1, 9):
        chain = TokenTree.chain(g)
        candidates.append(
            Candidate(
                f"sd:gamma={g},drafter=model",
                "sd",
                {"gamma": g, "drafter": "model"},
                chain,
                tree_value(chain, reach),
                sd_seconds(chain),
                sd_prefill,
                new_tokens,
            )
        )
    for k in PAPER_K_CONFIGS:
        tree = TokenTree.from_branching([int(x) for x in k.split("x")])
        candidates.append(
            Candidate(
                f"mcsd:k_config={k},replacement=false",
                "mcsd",
                {"k_config": k, "replacement": replacement},
                tree,
                tree_value(tree, reach),
                seconds(tree),
                prefill,
                new_tokens,
            )
        )
    for n in OPTIMAL_SIZES:
        best = max(
            (table.tree(n, d) for d in range(1, AUTO_MAX_DEPTH + 1) if np.isfinite(table.value(n, d))),
            key=lambda t: tree_value(t, reach) / seconds(t),
        )
        candidates.append(
            Candidate(
                f"mcsd, optimal tree of {n} nodes",
                "mcsd",
                {"tree": best, "replacement": replacement},
                best,
                tree_value(best, reach),
                seconds(best),
                prefill,
                new_tokens,
            )
        )
    # every kind priced as it ran here: the fastest choice, and tree=auto's at the start of a call (the same, where
    # it beats plain steps by the controller's margin)
    priced = {
        "per_node": overhead[1],
        "plain_cost": target_cost.scaled(ar_factor),
        "chain_cost": target_cost.scaled(factors["chain"][0]),
        "chain_draft_cost": draft_cost.scaled(factors["chain"][1]),
        "plain_overhead": ar_overhead,
        "chain_overhead": chain_overhead,
    }
    tree_prices = (
        table,
        tree_cost.scaled(factors["tree"][0]),
        draft_cost.scaled(factors["tree"][1]),
        context,
        overhead[0],
    )
    choice = fastest_tree(*tree_prices, **priced)
    fastest = table.tree(choice.nodes, choice.depth)
    if fastest.size:
        candidates.append(
            Candidate(
                "mcsd, the fastest optimal tree",
                "mcsd",
                {"tree": fastest, "replacement": replacement},
                fastest,
                tree_value(fastest, reach),
                seconds(fastest),
                prefill,
                new_tokens,
            )
        )
    # its prior is the rates the table above was built from, by depth (a pooled prior drew narrower trees than
    # the ones priced here: deeper levels accept more, and their second children most)
    prior = ranks.prior_text(AUTO_MAX_DEPTH)
    # tree=auto is offered with every price tune measured: the work besides forwards of a tree iteration, a
    # plain step and a chain, and the forward factors of each kind. Its choices are then the ones priced here;
    # with a prior it skips the one-node tries of a call without one, so where no tree pays it runs plain steps
    # from its first call. (Priced with a tree's work for every kind and no factors, it drafted more, and on the
    # compiled step ran below ar in 10 of 12 combos of the held-out protocol.)
    work = "/".join(f"{x * 1000:.4f}" for x in (*overhead, ar_overhead, *chain_overhead))
    scale = "/".join(
        f"{x:.4f}"
        for x in (ar_factor, factors["chain"][0], factors["tree"][0], factors["chain"][1], factors["tree"][1])
    )
    auto_choice = fastest_tree(*tree_prices, **priced, margin=DRAFT_MARGIN)
    auto_tree = table.tree(auto_choice.nodes, auto_choice.depth) if auto_choice.nodes else None
    auto_tokens, auto_seconds = (
        (tree_value(auto_tree, reach), seconds(auto_tree)) if auto_tree is not None else (1.0, candidates[0].seconds)
    )
    candidates.append(
        Candidate(
            f"mcsd:tree=auto,acceptance={prior},overhead={work},factors={scale},replacement=false",
            "mcsd",
            {"tree": "auto", "acceptance": prior, "overhead": work, "factors": scale, "replacement": replacement},
            auto_tree,
            auto_tokens,
            auto_seconds + _search_seconds(table, target_cost, draft_cost, context, new_tokens / auto_tokens),
            prefill if auto_tree is not None else ar_prefill,
            new_tokens,
        )
    )

    ranked = sorted(candidates, key=lambda c: -c.predicted_tokens_per_second)
    # the best few, and always ar and the best chain: a plan is then never a tree that measured slower on
    # these prompts than plain sd
    best_chain = next(c for c in ranked if c.method == "sd")
    to_measure = ranked[:measure] + [c for c in (best_chain, candidates[0]) if c not in ranked[:measure]]
    for c in to_measure:
        say(f"measuring {c.label} (predicted {c.predicted_tokens_per_second:.1f} tokens/s) ...")
    _warm_up(target, draft, prompts[0], [(c.method, c.params) for c in to_measure], settings)
    # prompt by prompt, every candidate on each: a drift of the host's speed (15 % between two runs of the same
    # tokens minutes apart) then falls on all candidates alike, not on whichever ran during it
    stats: list[list[dict]] = [[] for _ in to_measure]
    for i, prompt in enumerate(prompts):
        for c, runs in zip(to_measure, stats, strict=True):
            runs += _run(target, draft, [prompt], c.method, c.params, settings, first=i)
    for c, runs in zip(to_measure, stats, strict=True):
        new = sum(s["new_tokens"] for s in runs)
        c.measured_tokens_per_second = new / sum(s["seconds"] for s in runs)
        c.measured_block_efficiency = new / max(1, sum(s["target_calls"] for s in runs))
    chosen = max(to_measure, key=lambda c: c.measured_tokens_per_second)
    probe = {
        "tree": wide.parents.tolist(),
        "chain": PROBE_CHAIN,
        "prompts": len(prompts),
        "forward_factors": {"tree": factors["tree"], "chain": factors["chain"], "sd": sd_factors, "ar": ar_factor},
        "sd_chains": [shape.size for shape, _, _ in sd_runs],
        "sd_overhead_seconds": [sd_base, sd_per_node],
        "chain_overhead_seconds": list(chain_overhead),
        "ar_prompts": len(ar_prompts),
        "expected_new_tokens": {"mean": new_tokens, "runs": len(all_runs)},
        "prefill_seconds": {"ar": ar_prefill, "sd": sd_prefill, "mcsd": prefill},
        "bucket_route": routes,
    }
    return TuneResult(ranked, chosen, ranks, overhead, ar_overhead, context, settings, probe)


def _forward_factors(
    runs, target_cost: ForwardCost, draft_cost: ForwardCost, tree_cost: ForwardCost | None = None
) -> dict[str, tuple[float, float]]:
    """Measured over predicted forward seconds, target and draft, for tree and chain proposals: a chain's
    target forward against the causal curve, a tree's against `tree_cost` (the masked forward's; default the
    causal), the draft's against its curve. Each model's first call holds the
    prompt (the target's also the first tree): its measured seconds are taken off, and that call with them."""
    out = {}
    for kind in ("tree", "chain"):
        t_meas = t_pred = d_meas = d_pred = 0.0
        for shape, st, n_prompt in runs:
            calls = st["target_calls"]
            if ("chain" if shape.is_chain else "tree") != kind or calls < 2:
                continue
            c = n_prompt + st["new_tokens"] // 2
            t_meas += st["target_seconds"] - st["prefill_seconds"]
            t_pred += (calls - 1) * (target_cost if kind == "chain" else tree_cost or target_cost)(1 + shape.size, c)
            if shape.size and st["draft_calls"]:
                d_meas += st["draft_seconds"] - st["draft_prefill_seconds"]
                # every iteration drafts each level but the last; all but the first catch up a token first
                d_pred += st["iterations"] * sum(draft_cost(w, c) for w in shape.widths()[:-1]) + (
                    st["iterations"] - 1
                ) * draft_cost(1, c)
        out[kind] = tuple(
            float(np.clip(m / p, 0.5, 3.0)) if p > 0 and m > 0 else 1.0 for m, p in ((t_meas, t_pred), (d_meas, d_pred))
        )
    return out


def _warm_up(target, draft, prompt: Prompt, methods: list[tuple[str, dict]], settings: dict) -> None:
    """A few tokens of each method on `prompt`, untimed."""
    short = dict(settings, max_new_tokens=min(WARM_UP_TOKENS, settings["max_new_tokens"]))
    for method, params in methods:
        _run(target, draft, [prompt], method, params, short)


def _prefill_seconds(runs: list[tuple[dict, int]], prompt_tokens: float) -> float:
    """Seconds of the prompt's forwards (target and draft) for a prompt of `prompt_tokens`, pro rata from
    (stats, prompt tokens) runs."""
    seconds = sum(st["prefill_seconds"] + (st.get("draft_prefill_seconds") or 0.0) for st, _ in runs)
    return seconds / max(1, sum(n for _, n in runs)) * prompt_tokens


def _fit_overhead(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """Per-iteration seconds besides forwards as a + b * nodes, least squares over the probe runs (b >= 0)."""
    if not samples:
        return 0.0, 0.0
    x, y = np.array(samples).T
    if np.ptp(x) < 1e-9:
        return float(y.mean()), 0.0
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return float(y.mean()), 0.0
    return max(0.0, float(a)), float(b)


def _search_seconds(table: TreeTable, target_cost, draft_cost, context: int, calls: float) -> float:
    """tree=auto's search (a table, then the fastest of its trees), timed once here, times the searches its
    schedule makes in `calls` iterations, spread over them."""
    # rates no search has seen (tables are cached by their rates)
    rates = np.random.default_rng().uniform(0.25, 0.35, (table.max_depth, 8))
    t0 = time.perf_counter()
    search_tree(rates, table.max_nodes, table.max_depth, target_cost, draft_cost, context)
    calls = max(1, round(calls))
    return (time.perf_counter() - t0) * sum(replans(c) for c in range(1, calls + 1)) / calls


def write_plan(result: TuneResult, path: str | Path, models: dict) -> Path:
    """The plan file, and the chosen tree beside it (`<name>.tree.json`) when the plan has one."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--out {path} is a folder; give a file name such as plan.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    c = result.chosen
    params = {k: v for k, v in c.params.items() if not isinstance(v, TokenTree)}
    if isinstance(c.params.get("tree"), TokenTree):
        tree_path = path.with_name(path.stem + ".tree.json")
        tree_path.write_text(json.dumps({"parents": c.params["tree"].parents.tolist()}) + "\n")
        params["tree"] = tree_path.name  # relative to the plan file
    plan = {
        "format": PLAN_FORMAT,
        "method": c.method,
        "params": params,
        "predicted_tokens_per_second": round(c.predicted_tokens_per_second, 3),
        "measured_tokens_per_second": _round(c.measured_tokens_per_second),
        "settings": result.settings,
        "models": models,
        "machine": {
            "host": platform.node(),
            "processor": platform.processor() or platform.machine(),
            "date": datetime.date.today().isoformat(),
        },
        "evidence": {
            "context_tokens": result.context,
            "overhead_seconds": {
                "per_iteration": result.overhead[0],
                "per_node": result.overhead[1],
                "ar_per_step": result.ar_overhead,
            },
            "rank_acceptance": result.ranks.as_dict(),
            "chosen": c.row(),
            "candidates": [c.row() for c in result.candidates],
            "probe": result.probe,
        },
    }
    path.write_text(json.dumps(plan, indent=1) + "\n")
    return path


@dataclass(frozen=True)
class Plan:
    """A plan file read back: its method spec (trees as absolute paths) and the whole file."""

    spec: str
    data: dict


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    data = read_json(path, "plan file")
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT or "method" not in data:
        raise ValueError(f"{str(path)!r} is not a plan file written by multispec tune (format {PLAN_FORMAT})")
    params = dict(data.get("params") or {})
    if isinstance(params.get("tree"), str) and params["tree"] != "auto":
        params["tree"] = str((path.parent / params["tree"]).resolve())
    spec = data["method"] + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
    parse_method(spec)  # a plan whose parameters do not round-trip is refused here
    return Plan(spec, data)


def plan_mismatches(plan: Plan, models: dict[str, str], host: str | None = None) -> list[str]:
    """How a run differs from what its plan was priced on: other models, dtype or compilation, another host.

    `models` maps each loaded model's name to its description (`ModelPair.description`); a method that loads no
    draft is compared on the target alone. A plan priced on eager forwards can choose otherwise than on compiled
    ones (their cost curves differ in shape), so such a run is told to tune again with its own flags.
    """
    tuned = plan.data.get("models") or {}
    said = []
    for name, described in models.items():
        if name not in tuned:
            said.append(f"the plan was tuned on {' / '.join(tuned) or 'unknown models'}; this run loads {name}")
        elif tuned[name] != described:
            said.append(f"the plan was tuned with {tuned[name]!r}; this run loads {described!r}")
    tuned_host = (plan.data.get("machine") or {}).get("host")
    host = platform.node() if host is None else host
    if tuned_host and tuned_host != host:
        said.append(f"the plan was tuned on host {tuned_host!r}; this is {host!r}")
    if said:
        said[-1] += ": its choice was priced on other forwards; run `multispec tune` here with this run's flags"
    return said


def table(result: TuneResult) -> str:
    """The candidates as a text table, best prediction first."""
    lines = [f"{'plan':58s} {'tree':34s} {'tok/call':>8s} {'pred tok/s':>10s} {'meas tok/s':>10s}"]
    for c in result.candidates:
        r = c.row()
        meas = (
            f"{r['measured_tokens_per_second']:10.1f}" if r["measured_tokens_per_second"] is not None else f"{'-':>10s}"
        )
        label = c.label if len(c.label) <= 58 else c.label[:55] + "..."
        lines.append(f"{label:58s} {r['tree']:34s} {c.tokens:8.2f} {c.predicted_tokens_per_second:10.1f} {meas}")
    return "\n".join(lines)
