"""`dsbd`: dynamic-width speculative beam decoding (seed 003): beam sampling made fast by a draft forest.

State: the hypotheses (input beams): token rows of one length with their joint target log-likelihoods,
one cache row each in both runners.
propose: `ForestDraft`: from every input beam the draft beam-samples `draft_width` nodes per layer for
         `gamma` layers, i.i.d. from its jointly warped beam distribution, each node in its input beam's
         cache row (a tree per row);
score:   one target forward over the whole forest: one batch row per input beam, ancestor-only masks,
         positions by depth (`ModelRunner.feed_rows`);
verify:  `forest_verify`: layer by layer, each layer's drafts tested against the target's beam
         distribution over the accepted nodes of the layer before (residual after a rejection, reset
         after an acceptance, children of rejected nodes rejected); a layer passes with `dynamic_width`
         accepted drafts (the largest K with P(at least K accepted) >= `width_threshold`, at least
         `min_width`; threshold 0: all of them); the first failing layer, or the one after the last, is
         the output layer of `draft_width` beams, independent draws from the target's beam distribution;
commit:  the output beams become the hypotheses (`commit_rows`: each keeps its path's cache entries; two
         outputs of one tree each get a copy). With `one_cache` only one is kept - `output`: 'best' (the
         paper: the most likely under the target) or 'sample' (the authors' code: the drawn one) - so
         both runners hold one cache row (§3.6).

The answer is chosen as `beam` chooses (`beam.answer`, `length_penalty`). With `width_threshold=0`
every layer has `draft_width` beams and the beams follow the law of `beam` of that width (Theorem 3.1);
`draft_width=1` is `sd`. `one_cache` keeps no known law (a heuristic judged by perplexity).
"""

from __future__ import annotations

import torch

from ..engine import Session
from ..proposers import Forest, ForestDraft, grow_rows
from ..verify import forest_verify
from .beam import answer


def decode(s: Session, gamma: int = 3, draft_width: int = 3, width_threshold: float = 0.7, min_width: int = 1,
           one_cache: bool = False, output: str = "best", length_penalty: float = 1.0, layer_rule=None) -> None:
    """`layer_rule` (hidden): a layer verifier in place of `beam_layer_verify` (tests)."""
    proposer = ForestDraft()
    rows = [list(s.tokens)]
    scores = torch.zeros(1, dtype=torch.float64)
    finished: list[tuple[float, list[int]]] = []
    widths: list[int] = []
    start = s.prompt_length
    while True:
        room = s.max_new_tokens - (len(rows[0]) - start)
        if s.max_length is not None:
            room = min(room, s.max_length - len(rows[0]))
        if room <= 0:
            break
        g = min(gamma, room - 1)
        forest = proposer.propose(s, rows, draft_width, g, scores) if g > 0 else Forest([], [], [])
        logprobs, node_logprobs, target_paths = _score(s, rows, forest)
        d, outputs, out_scores, info = forest_verify(
            scores, logprobs, forest.layers, node_logprobs, s.sampling, draft_width, width_threshold, min_width,
            stops=s.stop_tokens, generator=s.generator, layer_rule=layer_rule)
        widths += info["widths"]
        s.count(d - 1, d <= g, drafted=g, nodes=g * draft_width)
        for layer, j, score in info["finished"]:
            beam = rows[forest.roots[layer - 1][j]] + _path(forest, layer, j)
            finished.append((score, beam[start:]))
        if one_cache and outputs:
            keep = (max(range(len(outputs)), key=lambda i: float(out_scores[i])) if output == "best"
                    else info["drawn"])
            outputs, out_scores = [outputs[keep]], out_scores[keep : keep + 1]
        new_rows, new_scores, sources, target_kept, draft_kept = [], [], [], [], []
        for (u, token), score in zip(outputs, out_scores.tolist(), strict=True):
            if d == 1:
                root, path, t_kept, d_kept = u, [], [], []
            else:
                root = forest.roots[d - 2][u]
                path = _path(forest, d - 1, u)
                t_kept, d_kept = target_paths[d - 2][u], forest.draft_paths[d - 2][u]
            beam = rows[root] + path + [token]
            if token in s.stop_tokens:
                finished.append((score, beam[start:]))
                continue
            new_rows.append(beam)
            new_scores.append(score)
            sources.append(root)
            target_kept.append(t_kept)
            draft_kept.append(d_kept)
        if not new_rows:
            rows = []
            break
        s.target.commit_rows(len(new_rows[0]), sources, target_kept)
        if s.draft is not None:
            s.draft.commit_rows(len(new_rows[0]), sources, draft_kept)
        rows, scores = new_rows, torch.tensor(new_scores, dtype=torch.float64)
    candidates = finished + [(float(sc), r[start:]) for sc, r in zip(scores.tolist(), rows, strict=False)]
    s.append(answer(candidates, length_penalty))
    s.info["mean_layer_width"] = sum(widths) / len(widths) if widths else None


def _score(s: Session, rows: list[list[int]], forest: Forest):
    """One target forward over the forest. Returns the log-probabilities after each input beam [B, V], after
    each node per layer ([m, V] each), and each node's path of target cache offsets in its row."""
    entries: list[list] = [[] for _ in rows]
    paths_by_layer, where = [], []
    previous: list[list[int]] = [[] for _ in rows]
    for d, layer in enumerate(forest.layers, start=1):
        previous, at = grow_rows(entries, forest.roots[d - 1], layer.tokens.tolist(),
                                 [previous[p] for p in layer.parents.tolist()], d)
        paths_by_layer.append(previous)
        where.append(at)
    logits = s.target.feed_rows(rows, entries)  # [B, 1 + S, V]; padding entries are never read
    nodes = [torch.log_softmax(logits[row, 1 + index].double(), -1) for row, index in where]
    return torch.log_softmax(logits[:, 0].double(), -1), nodes, paths_by_layer


def _path(forest: Forest, layer: int, j: int) -> list[int]:
    """The tokens from layer 1 down to node j of `layer`."""
    tokens = []
    for d in range(layer, 0, -1):
        tokens.append(int(forest.layers[d - 1].tokens[j]))
        j = int(forest.layers[d - 1].parents[j])
    return tokens[::-1]
