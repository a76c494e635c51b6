"""`batch-sd`: M independent draft chains of gamma tokens, scored by the target in one tree-masked
forward and verified with seed 002's batch rule (first tokens by recursive rejection, then the chosen
chain alone).

The M chains form a tree whose root is the last committed token: node (depth d, chain m) sits at
index (d - 1) * M + m, so each depth is one contiguous slice and the draft extends all chains in one
forward per depth.
"""

from __future__ import annotations

import torch

from ..engine import Session
from ..trees import TokenTree
from ..verify.multi import batch_verify


def chains_tree(chains: int, depth: int) -> TokenTree:
    return TokenTree.from_parents([-1 if i < chains else i - chains for i in range(chains * depth)])


def decode(s: Session, drafts: int = 4, gamma: int = 4, bonus: bool = True) -> None:
    m = drafts
    trees: dict[int, TokenTree] = {}
    while not s.done:
        g = min(gamma, s.budget() - 1) if bonus else max(1, min(gamma, s.budget()))
        if g <= 0:  # room for one token only: a plain target step
            s.commit([int(s.sample(s.sampling.probs(s.target.feed(s.tokens)[-1])))])
            continue
        tree = trees.get(g) or trees.setdefault(g, chains_tree(m, g))
        # propose: M i.i.d. first tokens from the root, then each chain extended by its own draft row
        root = s.sampling.probs(s.draft.feed(s.tokens)[-1])
        rows = [root.expand(m, -1)]
        level = s.sample(root.expand(m, -1))
        tokens = [level]
        for d in range(1, g):
            logits = s.draft.feed(s.tokens, level, tree=tree, nodes=slice((d - 1) * m, d * m))
            q = s.sampling.probs(logits[-m:])
            level = s.sample(q)
            rows.append(q)
            tokens.append(level)
        drafts_t = torch.stack(tokens, 1)  # [M, g]
        draft_probs = torch.stack(rows, 1)  # [M, g, V]
        # score: one target forward over the pending token(s) and all M * g nodes
        # node order is depth-major; without a bonus token the deepest level needs no target scoring
        scored = g if bonus else g - 1
        flat = drafts_t[:, :scored].t().reshape(-1)
        logits = s.target.feed(s.tokens, flat, tree=tree, nodes=slice(0, scored * m))
        target = s.sampling.probs(logits)  # [1 + M scored, V]
        node_rows = target[1:].reshape(scored, m, target.shape[-1]).transpose(0, 1)  # [M, scored, V]
        target_probs = torch.cat([target[:1].expand(m, 1, -1), node_rows], 1)  # [M, scored + 1, V]
        device = target_probs.device
        chosen, n, token = batch_verify(target_probs, draft_probs.to(device), drafts_t.to(device), s.generator,
                                        bonus=bonus)
        path = [] if chosen is None else [d * m + chosen for d in range(n)]
        new = drafts_t[chosen, :n].tolist() if chosen is not None else []
        if token is not None:
            new.append(int(token))
        s.commit(new, drafted=m * g, accepted=n, rejected=n < g)
        s.target.commit(len(s.tokens), path)
        s.draft.commit(len(s.tokens), path)
