"""Token-tree methods: `mcsd` (MCSD, Yang et al., 2024), `specinfer` (Miao et al., 2023) and `batch-sd`
(Yin et al., 2024) on one loop.

propose: `DraftTree` expands the tree level by level (one draft forward per level): a full tree of the
         k-config, any tree given as `tree=FILE`, or with `tree=auto` the tree the controller picks each
         iteration (`multispec.drafting.shape`); or the `drafter` copies (`multispec.drafting.copying`:
         fixed nodes), or both as branches of one tree;
score:   one target forward over the uncached committed token and every node, with an ancestor-only mask
         and depth positions (`tree_attention`), or, for MCSD's ablation (§3.11), one batch row of copied
         caches per root-to-leaf path (same rows, same tokens, more cost);
verify:  `tree_verify` with a node rule (Algorithm 1, Algorithm 2 or the naive MCNS); the session counts
         acceptance by depth and sibling rank (`multispec.tree_search`);
commit:  the session commits the target's accepted path; the drafter keeps its own.

SpecInfer's multi-step speculative sampling with one draft model and i.i.d. children is MCSD's
Algorithm 1 (and without replacement, Algorithm 2): `specinfer` is this loop on SpecInfer's expansion
tree, and gives the same tokens as `mcsd` for the same seed, tree and replacement mode.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..drafting import Drafter, make_drafter
from ..drafting.shape import OVERHEAD_PRIOR, PLAIN_OVERHEAD_PRIOR, AutoTree, Factors
from ..engine import Entries, ModelRunner, Session
from ..models.cost import forward_cost
from ..tree_search import RankAcceptance, record_verdict
from ..trees import MAX_TREE_NODES, Shape, TokenTree, load_tree, parse_k_config, tree_from_json
from ..verify import (
    greedy_tree_verify,
    naive_rejection,
    recursive_rejection,
    tree_verify,
    without_replacement_rejection,
)
from ..warp import argmax
from .loop import speculate
from .registry import (
    BONUS,
    MAX_DEPTH,
    MAX_ROWS,
    Method,
    Param,
    drafter_params,
    k_config_param,
    register,
    size,
)

# the node rules whose outcome on one-hot target rows `greedy_tree_verify` gives
EXACT_RULES = (recursive_rejection, without_replacement_rejection, naive_rejection)


def speculate_tree(
    s: Session,
    drafter: Drafter,
    shape: Shape,
    rule,
    bonus: bool = True,
    tree_attention: bool = True,
    drafted_per_depth: int = 1,
    rank_key: str = "model",
) -> None:
    """The tree loop. `drafted_per_depth`: draft positions counted per depth (1 for a tree, M for M chains),
    for the acceptance rate; `rank_key`: the drafter and draw mode its rank acceptance is counted under."""

    def verify(proposal):
        tree = proposal.tree
        # without a bonus token the deepest level needs no scoring when it comes last (breadth first)
        scored = tree.size if bonus else _unscored_from(tree)
        if tree_attention:
            logits = s.target.feed([s.tokens], Entries.tree(tree, proposal.tokens[:scored], slice(0, scored)))[0]
        else:
            logits = score_paths(s.target, s.tokens, proposal.tokens, tree)
        if s.sampling.greedy and rule in EXACT_RULES:  # one-hot target rows: decided by their argmax alone
            verdict = greedy_tree_verify(tree, proposal.tokens, argmax(logits), bonus, proposal.live, proposal.fixed)
        else:
            target_probs = s.sampling.probs(logits)  # [1 + scored, V]: row 0 the root, row 1 + g node g
            verdict = tree_verify(
                tree,
                proposal.tokens,
                target_probs,
                proposal.draft_probs,
                s.generator,
                rule,
                bonus,
                proposal.live,
                proposal.fixed,
            )
        record_verdict(s.ranks, rank_key, tree, verdict.accepted, verdict.rejected, proposal.live, proposal.fixed)
        return verdict

    def counted(proposal):
        depth = proposal.tree.max_depth
        paths = None if tree_attention else root_paths(proposal.tree)
        return {"drafted": depth * drafted_per_depth, "nodes": proposal.size, "depth": depth, "paths": paths}

    speculate(s, drafter, shape, verify, bonus, counted)


def root_paths(tree: TokenTree) -> list[list[int]]:
    """The tree's root-to-leaf paths (lists of nodes), leaves in node order."""
    return [tree.path(leaf) for leaf in tree.leaves()]


def score_paths(runner: ModelRunner, tokens: list[int], drafts: torch.Tensor, tree: TokenTree) -> torch.Tensor:
    """Score a tree without tree attention (MCSD §3.11): the cache is copied once per root-to-leaf path and each
    cache row feeds the uncached committed token and its path, as a chain. The same rows as a tree forward -
    [1 + N, V], row 0 the root, row 1 + g node g - at the cost of K copies of the cache and K times the work.
    The session's commit (`paths=`) keeps the row that holds the accepted path."""
    paths = root_paths(tree)
    depth = len(paths[0])
    if any(len(p) != depth for p in paths):
        raise ValueError("scoring one cache row per path needs every leaf at the same depth")
    runner.commit(len(tokens), sources=[0] * len(paths))  # one copy of the cache per path
    logits = runner.feed(
        [tokens] * len(paths), Entries.chain(drafts[torch.tensor(paths, device=drafts.device)])
    )  # [K, 1 + depth, V]
    row_of: dict[int, int] = {}  # node -> the first path (cache row) holding it
    for r, path in enumerate(paths):
        for g in path:
            row_of.setdefault(g, r)
    rows = torch.tensor([0] + [row_of[g] for g in range(tree.size)])
    cols = torch.tensor([0] + tree.depth.tolist())
    return logits[rows.to(logits.device), cols.to(logits.device)]


def _unscored_from(tree: TokenTree) -> int:
    """The first node of the deepest level when that level ends the node order, else every node."""
    deepest = (tree.depth == tree.max_depth).nonzero().flatten()
    start = int(deepest[0])
    return start if int(deepest[-1]) == tree.size - 1 and deepest.numel() == tree.size - start else tree.size


def node_rule(verifier: str, replacement: bool):
    if verifier == "naive":
        return naive_rejection
    return recursive_rejection if replacement else without_replacement_rejection


def decode_mcsd(
    s: Session,
    *,
    k_config: str,
    tree,
    acceptance: str | None,
    adapt: bool,
    overhead: str | None,
    factors: str | None,
    replacement: bool,
    tree_attention: bool,
    verifier: str,
    drafter: str,
    min_ngram: int,
    max_ngram: int,
) -> None:
    if not tree_attention and drafter != "model":
        raise ValueError(
            "tree_attention=false (one cache row per path) needs drafter=model: copied branches "
            "have paths of different lengths"
        )
    if not tree_attention and tree is not None:
        raise ValueError(
            "tree_attention=false (one cache row per path) takes k-config trees only: every leaf must be at one depth"
        )
    _decode_tree(
        s,
        k_config,
        tree,
        AutoSettings(acceptance, adapt, overhead, factors),
        replacement,
        node_rule(verifier, replacement),
        drafter,
        min_ngram,
        max_ngram,
        tree_attention,
    )


def decode_specinfer(
    s: Session,
    *,
    k_config: str,
    tree,
    acceptance: str | None,
    adapt: bool,
    overhead: str | None,
    factors: str | None,
    replacement: bool,
    drafter: str,
    min_ngram: int,
    max_ngram: int,
) -> None:
    _decode_tree(
        s,
        k_config,
        tree,
        AutoSettings(acceptance, adapt, overhead, factors),
        replacement,
        node_rule("mcss", replacement),
        drafter,
        min_ngram,
        max_ngram,
    )


class AutoSettings(NamedTuple):
    """tree=auto's own parameters, as given."""

    acceptance: str | None
    adapt: bool
    overhead: str | None
    factors: str | None


def _decode_tree(
    s: Session,
    k_config: str,
    tree,
    auto_settings: AutoSettings,
    replacement: bool,
    rule,
    drafter: str,
    min_ngram: int,
    max_ngram: int,
    tree_attention: bool = True,
) -> None:
    if tree != "auto":
        for name, value, unset in zip(AutoSettings._fields, auto_settings, (None, False, None, None), strict=True):
            if value != unset:
                raise ValueError(f"{name} is a parameter of tree=auto; it needs tree=auto")
    proposer = make_drafter(drafter, s, tree=True, replacement=replacement, min_ngram=min_ngram, max_ngram=max_ngram)
    key = f"{drafter if drafter != 'hybrid' else 'model'}/{draw_mode(s, replacement)}"
    if tree != "auto":
        shape = parse_k_config(k_config) if tree is None else as_tree(tree)
        return speculate_tree(s, proposer, shape, rule, tree_attention=tree_attention, rank_key=key)
    if drafter != "model":
        raise ValueError("tree=auto needs drafter=model: it shapes the draft model's tree from its acceptance")
    draft = s.draft_model
    factors = parse_factors(auto_settings.factors)
    auto = AutoTree(
        proposer,
        lambda: s.ranks.setdefault(key, RankAcceptance()),
        forward_cost(s.target_model),
        forward_cost(draft, batch_invariant=False),
        s.forward_seconds,
        lambda context: len(context) - s.target.committed,
        parse_acceptance(auto_settings.acceptance),
        tree_cost=forward_cost(s.target_model, masked=True),
        overhead=parse_overhead(auto_settings.overhead),
        factors=factors,
        adapt=auto_settings.adapt,
        one_time=s.one_time_seconds,
        chain=make_drafter("model", s, tree=False),
        draft_behind=lambda context: len(context) - (s.draft.committed if s.draft is not None else 0),
        budget=s.budget,
        load=getattr(s.target_model, "batch_load", None),
    )
    speculate_tree(s, auto, (1,) * auto.max_depth, rule, rank_key=key)
    s.info.update(auto.report(len(s.tokens)))


def draw_mode(s: Session, replacement: bool) -> str:
    """How a node's children are drawn: the top-k at temperature 0, else i.i.d. or without replacement."""
    return "top-k" if s.sampling.greedy else "iid" if replacement else "without-replacement"


def as_tree(value) -> TokenTree:
    """A `tree` parameter: a TokenTree, a list (parents or nested), or a JSON file holding one."""
    if isinstance(value, TokenTree):
        return TokenTree.canonical(value.parents.tolist())
    if isinstance(value, (list, dict)):
        return tree_from_json(value)
    return load_tree(value)


def parse_acceptance(text: str | None) -> list[float] | list[list[float]] | None:
    """'0.6/0.2/0.1' (or commas, in library calls) -> the prior acceptance of the rank-0, 1, 2 children;
    '0.5/0.2;0.6/0.3' -> one such row per depth from depth 1 (the last for every deeper level)."""
    if text is None:
        return None
    rows = []
    for part in str(text).split(";"):
        try:
            rates = [float(x) for x in part.replace(",", "/").split("/") if x.strip()]
        except ValueError:
            rates = []
        if not rates or any(not 0 <= r <= 1 for r in rates):
            raise ValueError(
                "acceptance must be rates in [0, 1] separated by '/' (rank 0 first), rows per depth "
                f"separated by ';', got {text!r}"
            )
        rows.append(rates)
    return rows[0] if len(rows) == 1 else rows


def _numbers(text) -> list[float]:
    try:
        return [float(x) for x in str(text).replace(",", "/").split("/")]
    except ValueError:
        return []


def parse_overhead(text: str | None) -> tuple[float, float, float, float, float]:
    """'A', 'A/B', 'A/B/C' or 'A/B/C/D/E' (milliseconds per tree iteration / per node / per plain step / per
    chain iteration / per chain node) -> seconds. Without C a plain step's work is the prior's, at most A;
    without D/E a chain's work is a tree's."""
    if text is None:
        return OVERHEAD_PRIOR, 0.0, PLAIN_OVERHEAD_PRIOR, OVERHEAD_PRIOR, 0.0
    values = _numbers(text)
    if len(values) not in (1, 2, 3, 5) or any(not (v >= 0 and v < float("inf")) for v in values):
        raise ValueError(
            "overhead must be milliseconds 'A', 'A/B', 'A/B/C' or 'A/B/C/D/E' (per tree iteration / "
            f"per node / per plain step / per chain iteration / per chain node, >= 0), got {text!r}"
        )
    per_node = values[1] if len(values) > 1 else 0.0
    plain = values[2] / 1000 if len(values) >= 3 else min(values[0] / 1000, PLAIN_OVERHEAD_PRIOR)
    chain = (values[3], values[4]) if len(values) == 5 else (values[0], per_node)
    return values[0] / 1000, per_node / 1000, plain, chain[0] / 1000, chain[1] / 1000


def parse_factors(text: str | None) -> Factors | None:
    """'P/C/T' or 'P/C/T/CD/TD' -> `Factors` (the target in a plain step, a chain, a tree; the draft in a chain,
    a tree)."""
    if text is None:
        return None
    values = _numbers(text)
    if len(values) not in (3, 5) or any(not (0.05 <= v <= 20) for v in values):
        raise ValueError(
            "factors must be 'P/C/T' or 'P/C/T/CD/TD', measured over calibrated forward seconds in "
            f"[0.05, 20], got {text!r}"
        )
    return Factors(*values)


def _check_factors(value) -> bool:
    parse_factors(value)
    return True


def _check_overhead(value) -> bool:
    parse_overhead(value)
    return True


def _check_tree(value) -> bool:
    if value == "auto":
        return True
    as_tree(value)  # raises with the reason
    return True


def _check_acceptance(value) -> bool:
    parse_acceptance(value)
    return True


TREE = Param(
    object,
    None,
    _check_tree,
    "'auto', a JSON list of parent indices or nested lists, or a JSON file of one",
    file=True,
    help="any tree instead of the k-config: a JSON file (a list of parent indices, -1 for the root's children, "
    "or nested lists of children); auto: the tree with the most tokens per second, chosen each iteration "
    "from the acceptance by sibling rank so far and the measured forward costs (optimal trees, Sequoia); "
    "a server takes the list inline, never a file",
)
ACCEPTANCE = Param(
    str,
    None,
    _check_acceptance,
    "rates in [0, 1] separated by '/', e.g. 0.6/0.2/0.1, or a row per depth separated by ';', e.g. '0.5/0.2;0.6/0.3'",
    "tree=auto's prior: acceptance of the rank-0, 1, ... child given the earlier ones were rejected "
    "(multispec tune writes it into plan files)",
)
ADAPT = Param(
    bool,
    False,
    rule="true or false",
    help="tree=auto: also follow this call's measured forward and per-iteration times (the same law, "
    "but the same seed may then give other tokens)",
)
OVERHEAD = Param(
    str,
    None,
    _check_overhead,
    "milliseconds 'A', 'A/B', 'A/B/C' or 'A/B/C/D/E', e.g. 1.5/0.05/0.4/0.5/0.2",
    "tree=auto's work besides forwards: A ms per tree iteration + B ms per node, C ms per plain step, "
    f"D ms per chain iteration + E per chain node (default {OVERHEAD_PRIOR * 1000:g}/0/"
    f"{PLAIN_OVERHEAD_PRIOR * 1000:g}; without C, min(A, {PLAIN_OVERHEAD_PRIOR * 1000:g}); without "
    "D/E, A/B; multispec tune writes the measured ones into plan files)",
)
FACTORS = Param(
    str,
    None,
    _check_factors,
    "'P/C/T' or 'P/C/T/CD/TD', e.g. 0.9/1.05/1.1/0.8/1.0",
    "tree=auto's measured over calibrated forward seconds: the target in a plain step, a chain and a "
    "tree (against the masked forward's curve), the draft in a chain and a tree (default 1; multispec "
    "tune writes them into plan files)",
)


def decode_batch(
    s: Session, *, drafts: int, gamma: int, bonus: bool, drafter: str, min_ngram: int, max_ngram: int
) -> None:
    """`batch-sd`: M chains drawn independently from the root; the batch rule of Yin et al. (recursive
    rejection on the first tokens, then the chosen chain alone) is Algorithm 1 on the tree of branching
    (M, 1, ..., 1). A copying drafter proposes its copied chain (`suffix`: up to M distinct ones)."""
    proposer = make_drafter(drafter, s, tree=True, replacement=True, min_ngram=min_ngram, max_ngram=max_ngram)
    speculate_tree(
        s,
        proposer,
        (drafts,) + (1,) * (gamma - 1),
        recursive_rejection,
        bonus=bonus,
        drafted_per_depth=drafts,
        rank_key=f"{drafter if drafter != 'hybrid' else 'model'}/{draw_mode(s, True)}",
    )


def tree_entries(params: dict) -> int:
    """A tree's iteration (`Method.row_entries`): a k-config's nodes and the committed token; a tree from a file,
    chosen each iteration or with copied branches, at most MAX_TREE_NODES."""
    if params.get("tree") is None and params.get("drafter", "model") == "model":
        return TokenTree.from_branching(parse_k_config(params["k_config"])).size + 1
    return MAX_TREE_NODES + 1


def replacement_param(default: bool, help: str) -> Param:
    return Param(
        bool,
        default,
        rule="true or false",
        help=help + "; at temperature 0 the children are the draft's top-k distinct tokens either way "
        "(i.i.d. argmax draws would all be one token, which MCSD §4.5 notes degenerates to sd)",
    )


register(
    Method(
        "batch-sd",
        decode_batch,
        needs_draft=True,
        exact="equals ar in distribution",
        summary="M independent draft chains verified together (batch SD of Yin et al., 2024)",
        row_entries=lambda params: int(params["drafts"]) * int(params["gamma"]) + 1,
        params={
            "drafts": size(4, MAX_ROWS, "number of draft chains M"),
            "gamma": size(4, MAX_DEPTH, "drafts per chain"),
            "bonus": BONUS,
            **drafter_params(tree=True),
        },
    )
)
register(
    Method(
        "mcsd",
        decode_mcsd,
        needs_draft=True,
        exact="equals ar in distribution",
        summary="multi-candidate speculative decoding on a token tree (MCSD, Yang et al., 2024)",
        row_entries=lambda params: tree_entries(params) if params["tree_attention"] else None,
        params={
            "k_config": k_config_param(
                "4x2x1x1", "children per node at each depth: 4x2x1x1 = 4 of the root, 2 of each"
            ),
            "tree": TREE,
            "acceptance": ACCEPTANCE,
            "adapt": ADAPT,
            "overhead": OVERHEAD,
            "factors": FACTORS,
            "replacement": replacement_param(
                False, "i.i.d. children (Algorithm 1) or draws without replacement in draw order (Algorithm 2)"
            ),
            "tree_attention": Param(
                bool,
                True,
                rule="true or false",
                help="score the tree in one masked row; false: one batch row of "
                "copied caches per root-to-leaf path (ablation)",
            ),
            "verifier": Param(
                str,
                "mcss",
                lambda v: v in ("mcss", "naive"),
                "'mcss' or 'naive'",
                "multi-candidate speculative sampling, or the naive MCNS baseline",
            ),
            **drafter_params(tree=True),
        },
    )
)
register(
    Method(
        "specinfer",
        decode_specinfer,
        needs_draft=True,
        exact="equals ar in distribution",
        summary="SpecInfer's multi-step speculative sampling on its expansion tree",
        row_entries=tree_entries,
        params={
            "k_config": k_config_param("1x1x3x1x1x1x1x1", "expansion tree: children per node at each depth"),
            "tree": TREE,
            "acceptance": ACCEPTANCE,
            "adapt": ADAPT,
            "overhead": OVERHEAD,
            "factors": FACTORS,
            "replacement": replacement_param(True, "i.i.d. children, or draws without replacement"),
            **drafter_params(tree=True),
        },
    )
)
