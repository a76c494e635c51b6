"""Token-tree methods: `mcsd` (seed 004), `specinfer` and `batch-sd` (seed 002) on one loop.

propose: `DraftTree` expands a full tree of the k-config level by level (one draft forward per level), or
         the `drafter` copies (`multispec.drafters`: fixed nodes), or both as branches of one tree;
score:   one target forward over the uncached committed token and every node, with an ancestor-only mask
         and depth positions (`tree_attention`), or, for the ablation of seed 004 §3.11, one batch row of
         copied caches per root-to-leaf path (same rows, same tokens, more cost);
verify:  `tree_verify` with a node rule (Algorithm 1, Algorithm 2 or the naive MCNS);
commit:  both caches keep the accepted path.

SpecInfer's multi-step speculative sampling with one draft model and i.i.d. children is MCSD's
Algorithm 1 (and without replacement, Algorithm 2): `specinfer` is this loop on SpecInfer's expansion
tree, and gives the same tokens as `mcsd` for the same seed, tree and replacement mode.
"""

from __future__ import annotations

from ..drafters import make_drafter
from ..engine import Session
from ..proposers import Proposer
from ..trees import parse_k_config
from ..verify import Verdict, naive_rejection, recursive_rejection, tree_verify, without_replacement_rejection
from .ar import draft_depths, target_step


def speculate_tree(
    s: Session,
    proposer: Proposer,
    shape: tuple[int, ...],
    rule,
    bonus: bool = True,
    tree_attention: bool = True,
    drafted_per_depth: int = 1,
) -> None:
    """The shared loop. `drafted_per_depth`: draft positions counted per depth (1 for a tree, M for M
    chains), for the acceptance rate."""
    for depth in draft_depths(s, len(shape), bonus):
        proposal = proposer.propose(s, shape[:depth])
        tree = proposal.tree
        if tree.size == 0:  # a copying drafter found nothing to copy
            s.commit(Verdict.token(target_step(s)))
            continue
        # without a bonus token the deepest level needs no scoring when it comes last (breadth first)
        scored = tree.size if bonus else _unscored_from(tree)
        if tree_attention:
            logits = s.target.feed(s.tokens, proposal.tokens[:scored], tree=tree, nodes=slice(0, scored))
        else:
            logits = s.target.feed_paths(s.tokens, proposal.tokens, tree)
        target_probs = s.sampling.probs(logits)  # [1 + scored, V]: row 0 the root, row 1 + g node g
        verdict = tree_verify(tree, proposal.tokens, target_probs, proposal.draft_probs, s.generator, rule,
                              bonus, proposal.live, proposal.fixed)
        s.commit(verdict, drafted=tree.max_depth * drafted_per_depth, nodes=tree.size, depth=tree.max_depth)
        proposer.observe(verdict)


def _unscored_from(tree) -> int:
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
    k_config: str = "4x2x1x1",
    replacement: bool = False,
    tree_attention: bool = True,
    verifier: str = "mcss",
    drafter: str = "model",
    min_ngram: int = 1,
    max_ngram: int = 3,
    rule=None,
) -> None:
    """`rule` (hidden): a node rule to use instead of the one `verifier` and `replacement` name (tests)."""
    shape = parse_k_config(k_config)
    if not tree_attention and drafter != "model":
        raise ValueError("tree_attention=false (one cache row per path) needs drafter=model: copied branches "
                         "have paths of different lengths")
    proposer = make_drafter(drafter, s, tree=True, replacement=replacement, min_ngram=min_ngram, max_ngram=max_ngram)
    speculate_tree(s, proposer, shape, rule or node_rule(verifier, replacement), tree_attention=tree_attention)


def decode_specinfer(s: Session, k_config: str = "1x1x3x1x1x1x1x1", replacement: bool = True,
                     drafter: str = "model", min_ngram: int = 1, max_ngram: int = 3) -> None:
    shape = parse_k_config(k_config)
    proposer = make_drafter(drafter, s, tree=True, replacement=replacement, min_ngram=min_ngram, max_ngram=max_ngram)
    speculate_tree(s, proposer, shape, node_rule("mcss", replacement))


def decode_batch(s: Session, drafts: int = 4, gamma: int = 4, bonus: bool = True, drafter: str = "model",
                 min_ngram: int = 1, max_ngram: int = 3) -> None:
    """`batch-sd`: M chains drawn independently from the root; seed 002's batch rule (recursive rejection
    on the first tokens, then the chosen chain alone) is Algorithm 1 on the tree of branching
    (M, 1, ..., 1). A copying drafter proposes its copied chain (`suffix`: up to M distinct ones)."""
    proposer = make_drafter(drafter, s, tree=True, replacement=True, min_ngram=min_ngram, max_ngram=max_ngram)
    speculate_tree(s, proposer, (drafts,) + (1,) * (gamma - 1), recursive_rejection, bonus=bonus,
                   drafted_per_depth=drafts)
