"""Verification of several candidates per position: token trees (MCSD, SpecInfer) and batches of chains.

Glossary (MCSD §3.3-3.5, §3.8):
  node rule   decides among the candidate children of one node. Signature
              rule(target [V], draft [V], candidates [k], generator) -> (index or None, token), where the
              token is the accepted candidate or, when all are rejected, a draw from the final residual
              (or the target sample for the naive rule). The three rules:
  recursive_rejection            candidates i.i.d. from draft (MCSD Algorithm 1; SpecInfer's multi-step
                                 speculative sampling with one draft). Each candidate is tested against
                                 the current residual, which becomes norm(max(0, residual - draft)) after
                                 a rejection; the draft row never changes. Exact for any k.
  without_replacement_rejection  candidates drawn one after another without replacement, tested in draw
                                 order (MCSD Algorithm 2): the residual uses the draft row *before* the
                                 rejected token is removed, then that token is zeroed in the draft row and
                                 the row renormalised. Exact for any k up to the draft's support.
  naive_rejection                MCNS: draw x from the target; accept the first candidate equal to x, else
                                 emit x. Exact, and accepts less often (MCSD Prop. C).
  tree_verify walks down a `TokenTree` from the root, applying a node rule to each accepted node's
              children, and returns one `Verdict`; `greedy_tree_verify` is its outcome on one-hot target
              rows (temperature 0), from the target's argmax tokens.
Rows follow the tree convention: row 0 is the root, row 1 + g is node g, for target and draft alike.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..trees import TokenTree
from ..warp import categorical
from .chain import residual
from .verdict import Verdict

NodeRule = Callable[..., tuple[int | None, int]]


def recursive_rejection(
    target: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[int | None, int]:
    """target, draft: [V]; candidates: [k] drawn i.i.d. from draft (duplicates kept: a repeat is always
    rejected, but its residual update must still happen). Returns (index of the accepted candidate, its
    token) or (None, a token from the final residual)."""
    current = target
    u = torch.rand(candidates.shape[0], generator=generator, device=target.device, dtype=target.dtype)
    for i, token in enumerate(candidates.tolist()):
        if u[i] * draft[token] < current[token]:
            return i, token
        current = residual(current, draft)
    return None, int(categorical(current, generator))


def without_replacement_rejection(
    target: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[int | None, int]:
    """target, draft: [V]; candidates: [k] distinct tokens drawn in this order without replacement from
    draft. Same return as `recursive_rejection`."""
    current, remaining = target, draft
    u = torch.rand(candidates.shape[0], generator=generator, device=target.device, dtype=target.dtype)
    for i, token in enumerate(candidates.tolist()):
        if u[i] * remaining[token] < current[token]:
            return i, token
        current = residual(current, remaining)
        remaining = remaining.clone()
        remaining[token] = 0
        mass = remaining.sum()
        if mass <= 0:  # the whole support has been drawn: no candidate can follow
            break
        remaining = remaining / mass
    return None, int(categorical(current, generator))


def naive_rejection(
    target: torch.Tensor, draft: torch.Tensor, candidates: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[int | None, int]:
    """MCNS: one target draw; accepted when it is among the candidates."""
    x = int(categorical(target, generator))
    hits = (candidates == x).nonzero()
    return (int(hits[0, 0]), x) if hits.numel() else (None, x)


def tree_verify(
    tree: TokenTree,
    tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    rule: NodeRule = recursive_rejection,
    bonus: bool = True,
    live: torch.Tensor | None = None,
    fixed: torch.Tensor | None = None,
) -> Verdict:
    """Walk down `tree` (MCSD §3.8): at each accepted node try its children with `rule`.

    Args:
        tree: the proposal's tree, N nodes laid out breadth first.
        tokens: [N] the nodes' token ids.
        target_probs: [1 + N, V] warped target rows (row 0 the root); without `bonus` the leaves' rows may be
            missing.
        draft_probs: [R, V] warped draft rows each node's children were drawn from (row 0 the root, row 1 + g
            node g; only nodes with children are read).
        generator: the random generator of the draws.
        rule: the node rule (`recursive_rejection`, `without_replacement_rejection`, `naive_rejection`).
        bonus: draw a target token after a fully accepted path.
        live: [N] bool, False for padding candidates that must never be accepted (a draw without replacement
            from a support smaller than the branching factor); None: all live.
        fixed: [N] bool, True for children proposed deterministically (a copying drafter: one-hot draft). A
            node's fixed children are tested first, each passing with the current residual's probability of its
            token, which then leaves the residual; the rest go to `rule` with the parent's draft row. None: no
            fixed nodes.

    Returns:
        A `Verdict`: the accepted path (node indices, root first) and its tokens, and the next token: from the
        target's own row at the accepted leaf if every depth passed (the bonus), else the node rule's token.
    """
    node, accepted = -1, []
    current = target_probs[0]
    while True:
        kids = tree.children(node)
        if live is not None:
            kids = tuple(k for k in kids if bool(live[k]))
        if not kids:
            break
        chosen, token, current = _fixed_children(current, kids, tokens, fixed, generator)
        if chosen is None:
            drawn = tuple(k for k in kids if fixed is None or not bool(fixed[k]))
            if drawn:
                index, token = rule(current, draft_probs[1 + node], tokens[list(drawn)], generator)
                chosen = None if index is None else drawn[index]
            else:
                token = int(categorical(current, generator))
        if chosen is None:
            return Verdict(tuple(accepted), tuple(int(tokens[a]) for a in accepted), int(token), True)
        node = chosen
        accepted.append(node)
        current = target_probs[1 + node] if bonus or tree.children(node) else None
    nxt = int(categorical(current, generator)) if bonus else None
    return Verdict(tuple(accepted), tuple(int(tokens[a]) for a in accepted), nxt, False)


def greedy_tree_verify(
    tree: TokenTree,
    tokens: torch.Tensor,
    target_tokens: torch.Tensor,
    bonus: bool = True,
    live: torch.Tensor | None = None,
    fixed: torch.Tensor | None = None,
) -> Verdict:
    """`tree_verify` where every target row is one-hot (temperature 0), with any of the three exact node rules,
    from the target's argmax tokens alone. At each accepted node the target's token y is certain: a candidate
    passes iff it is y (acceptance min(1, t(x) / d(x)) is 1 or 0; the naive rule's target draw is y), every
    residual of a one-hot row that rejected x is that row, so the first child that is y - fixed children
    first, then drawn ones, each group in node order, as `tree_verify` tries them - is accepted, and after a
    rejection the next token is y. No probability rows, no random numbers.

    target_tokens: [1 + N] (or fewer without `bonus`: the rows `tree_verify` would read), row 0 the root.
    """
    ids, target = tokens.tolist(), target_tokens.tolist()
    alive = None if live is None else live.tolist()
    copied = None if fixed is None else fixed.tolist()
    node, accepted = -1, []
    while True:
        kids = [k for k in tree.children(node) if alive is None or alive[k]]
        if not kids:
            break
        if copied is not None:
            kids = [k for k in kids if copied[k]] + [k for k in kids if not copied[k]]
        want = target[1 + node]
        chosen = next((k for k in kids if ids[k] == want), None)
        if chosen is None:
            return Verdict(tuple(accepted), tuple(ids[a] for a in accepted), want, True)
        node = chosen
        accepted.append(node)
    return Verdict(tuple(accepted), tuple(ids[a] for a in accepted), target[1 + node] if bonus else None, False)


def _fixed_children(current: torch.Tensor, kids, tokens: torch.Tensor, fixed, generator):
    """Test the fixed children among `kids` in order: (accepted child or None, its token, the residual)."""
    if fixed is None:
        return None, None, current
    for k in kids:
        if not bool(fixed[k]):
            continue
        token = int(tokens[k])
        u = torch.rand((), generator=generator, device=current.device, dtype=current.dtype)
        if u < current[token]:
            return k, token, current
        one_hot = torch.zeros_like(current)
        one_hot[token] = 1.0
        current = residual(current, one_hot)
    return None, None, current


def batch_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    bonus: bool = True,
) -> Verdict:
    """Batch speculative decoding (Yin et al., 2024, Algorithm 4) for M chains of g drafts from one prefix.

    target_probs: [M, g + 1, V] (row 0 is the shared distribution after the prefix);
    draft_probs:  [M, g, V] (row 0 likewise shared); tokens: [M, g], chains drawn independently.
    The first tokens go through recursive rejection; the chain whose first token is accepted is then
    verified alone with plain speculative sampling. This is `tree_verify` with the i.i.d. rule on the
    tree of branching (M, 1, ..., 1), whose node (depth d, chain m) is index (d - 1) * M + m; the verdict
    uses those indices.
    """
    m, g = tokens.shape
    tree = TokenTree.from_branching((m,) + (1,) * (g - 1))
    flat_tokens = tokens.t().reshape(-1)
    scored = target_probs[:, 1:].transpose(0, 1).reshape(-1, target_probs.shape[-1])  # g or g - 1 depths
    flat_target = torch.cat([target_probs[0, :1], scored])
    flat_draft = torch.cat([draft_probs[0, :1], draft_probs[:, 1:].transpose(0, 1).reshape(m * (g - 1), -1)])
    return tree_verify(tree, flat_tokens, flat_target, flat_draft, generator, recursive_rejection, bonus)
