"""Token-tree methods: `mcsd` (MCSD, Yang et al., 2024), `specinfer` (Miao et al., 2023) and `batch-sd`
(Yin et al., 2024) on one loop.

propose: `DraftTree` expands a full tree of the k-config level by level (one draft forward per level), or
         the `drafter` copies (`multispec.drafting.copying`: fixed nodes), or both as branches of one tree;
score:   one target forward over the uncached committed token and every node, with an ancestor-only mask
         and depth positions (`tree_attention`), or, for MCSD's ablation (§3.11), one batch row of copied
         caches per root-to-leaf path (same rows, same tokens, more cost);
verify:  `tree_verify` with a node rule (Algorithm 1, Algorithm 2 or the naive MCNS);
commit:  the session commits the target's accepted path; the drafter keeps its own.

SpecInfer's multi-step speculative sampling with one draft model and i.i.d. children is MCSD's
Algorithm 1 (and without replacement, Algorithm 2): `specinfer` is this loop on SpecInfer's expansion
tree, and gives the same tokens as `mcsd` for the same seed, tree and replacement mode.
"""

from __future__ import annotations

from ..drafting import Drafter, make_drafter
from ..engine import Session
from ..trees import TokenTree, parse_k_config
from ..verify import naive_rejection, recursive_rejection, tree_verify, without_replacement_rejection
from .loop import speculate
from .registry import BONUS, Method, Param, drafter_params, k_config_param, register


def speculate_tree(s: Session, drafter: Drafter, shape: tuple[int, ...], rule, bonus: bool = True,
                   tree_attention: bool = True, drafted_per_depth: int = 1) -> None:
    """The tree loop. `drafted_per_depth`: draft positions counted per depth (1 for a tree, M for M chains),
    for the acceptance rate."""

    def verify(proposal):
        tree = proposal.tree
        # without a bonus token the deepest level needs no scoring when it comes last (breadth first)
        scored = tree.size if bonus else _unscored_from(tree)
        if tree_attention:
            logits = s.target.feed(s.tokens, proposal.tokens[:scored], tree=tree, nodes=slice(0, scored))
        else:
            logits = s.target.feed_paths(s.tokens, proposal.tokens, tree)
        target_probs = s.sampling.probs(logits)  # [1 + scored, V]: row 0 the root, row 1 + g node g
        return tree_verify(tree, proposal.tokens, target_probs, proposal.draft_probs, s.generator, rule, bonus,
                           proposal.live, proposal.fixed)

    def counted(proposal):
        depth = proposal.tree.max_depth
        return {"drafted": depth * drafted_per_depth, "nodes": proposal.size, "depth": depth}

    speculate(s, drafter, shape, verify, bonus, counted)


def _unscored_from(tree: TokenTree) -> int:
    """The first node of the deepest level when that level ends the node order, else every node."""
    deepest = (tree.depth == tree.max_depth).nonzero().flatten()
    start = int(deepest[0])
    return start if int(deepest[-1]) == tree.size - 1 and deepest.numel() == tree.size - start else tree.size


def node_rule(verifier: str, replacement: bool):
    if verifier == "naive":
        return naive_rejection
    return recursive_rejection if replacement else without_replacement_rejection


def decode_mcsd(s: Session, *, k_config: str, replacement: bool, tree_attention: bool, verifier: str, drafter: str,
                min_ngram: int, max_ngram: int) -> None:
    if not tree_attention and drafter != "model":
        raise ValueError("tree_attention=false (one cache row per path) needs drafter=model: copied branches "
                         "have paths of different lengths")
    proposer = make_drafter(drafter, s, tree=True, replacement=replacement, min_ngram=min_ngram, max_ngram=max_ngram)
    speculate_tree(s, proposer, parse_k_config(k_config), node_rule(verifier, replacement),
                   tree_attention=tree_attention)


def decode_specinfer(s: Session, *, k_config: str, replacement: bool, drafter: str, min_ngram: int,
                     max_ngram: int) -> None:
    proposer = make_drafter(drafter, s, tree=True, replacement=replacement, min_ngram=min_ngram, max_ngram=max_ngram)
    speculate_tree(s, proposer, parse_k_config(k_config), node_rule("mcss", replacement))


def decode_batch(s: Session, *, drafts: int, gamma: int, bonus: bool, drafter: str, min_ngram: int,
                 max_ngram: int) -> None:
    """`batch-sd`: M chains drawn independently from the root; the batch rule of Yin et al. (recursive
    rejection on the first tokens, then the chosen chain alone) is Algorithm 1 on the tree of branching
    (M, 1, ..., 1). A copying drafter proposes its copied chain (`suffix`: up to M distinct ones)."""
    proposer = make_drafter(drafter, s, tree=True, replacement=True, min_ngram=min_ngram, max_ngram=max_ngram)
    speculate_tree(s, proposer, (drafts,) + (1,) * (gamma - 1), recursive_rejection, bonus=bonus,
                   drafted_per_depth=drafts)


def replacement_param(default: bool, help: str) -> Param:
    return Param(bool, default, rule="true or false",
                 help=help + "; at temperature 0 the children are the draft's top-k distinct tokens either way "
                             "(i.i.d. argmax draws would all be one token, which MCSD §4.5 notes degenerates to sd)")


register(Method("batch-sd", decode_batch, needs_draft=True, exact="equals ar in distribution",
                summary="M independent draft chains verified together (batch SD of Yin et al., 2024)",
                params={"drafts": Param(int, 4, lambda v: v >= 1, "an integer >= 1", "number of draft chains M"),
                        "gamma": Param(int, 4, lambda v: v >= 1, "an integer >= 1", "drafts per chain"),
                        "bonus": BONUS,
                        **drafter_params(tree=True)}))
register(Method("mcsd", decode_mcsd, needs_draft=True, exact="equals ar in distribution",
                summary="multi-candidate speculative decoding on a token tree (MCSD, Yang et al., 2024)",
                params={"k_config": k_config_param("4x2x1x1", "children per node at each depth: 4x2x1x1 = 4 of "
                                                   "the root, 2 of each"),
                        "replacement": replacement_param(False, "i.i.d. children (Algorithm 1) or draws without "
                                                                "replacement in draw order (Algorithm 2)"),
                        "tree_attention": Param(bool, True, rule="true or false",
                                                help="score the tree in one masked row; false: one batch row of "
                                                     "copied caches per root-to-leaf path (ablation)"),
                        "verifier": Param(str, "mcss", lambda v: v in ("mcss", "naive"), "'mcss' or 'naive'",
                                          "multi-candidate speculative sampling, or the naive MCNS baseline"),
                        **drafter_params(tree=True)}))
register(Method("specinfer", decode_specinfer, needs_draft=True, exact="equals ar in distribution",
                summary="SpecInfer's multi-step speculative sampling on its expansion tree",
                params={"k_config": k_config_param("1x1x3x1x1x1x1x1", "expansion tree: children per node at "
                                                   "each depth"),
                        "replacement": replacement_param(True, "i.i.d. children, or draws without replacement"),
                        **drafter_params(tree=True)}))
