"""search_tree (16-node tables first) against fastest_tree on the whole 64-node table: 300 random rate matrices
like tree=auto's, with this host's cached curves (~/.cache/multispec/forward_cost.json); same choice, and the
time of each search."""

import json
import os
import time

import numpy as np

from multispec import tree_search
from multispec.models.cost import ForwardCost
from multispec.tree_search import TreeTable, fastest_tree, reach_of, search_tree

STORE = json.load(open(os.path.expanduser("~/.cache/multispec/forward_cost.json")))


def curve(model: str, suffix: str) -> ForwardCost:
    key = next(k for k in STORE if k.startswith(model + "|") and "compiled" in k and k.endswith(suffix))
    e = STORE[key]
    return ForwardCost(tuple(tuple(r) for r in e["seconds"]), tuple(e["contexts"]), tuple(e["tokens"]),
                       e.get("padded", 0))


causal = curve("smollm2-135m-instruct", "isa=3f4dd431")
masked = curve("smollm2-135m-instruct", "masked")
draft = curve("smollm2-135m-instruct-draft", "isa=3f4dd431")
rng = np.random.default_rng(0)
same = whole_budget = 0
seconds_whole = seconds_first = 0.0
prices = dict(pending=1, per_node=1e-4, plain_cost=causal, chain_cost=causal, chain_draft_cost=draft,
              plain_overhead=5e-4)
for _ in range(300):
    top = rng.uniform(0.2, 0.95)
    rates = np.sort(rng.uniform(0, top, size=(12, 8)), axis=1)[:, ::-1] * rng.uniform(0.3, 1.0)
    context = int(rng.integers(50, 1500))
    t0 = time.perf_counter()
    a = fastest_tree(TreeTable(reach_of(rates), 64, 12), masked, draft, context, 1e-3, **prices)
    t1 = time.perf_counter()
    tree_search._table.cache_clear()  # time the tables, not the cache
    b, table = search_tree(rates, 64, 12, masked, draft, context, 1e-3, **prices)
    t2 = time.perf_counter()
    tree_search._table.cache_clear()
    seconds_whole += t1 - t0
    seconds_first += t2 - t1
    whole_budget += table.max_nodes == 64
    same += (a.nodes, a.depth, a.tokens_per_second) == (b.nodes, b.depth, b.tokens_per_second)
print(f"identical {same}/300, whole budget searched {whole_budget}/300, ms per search: "
      f"whole {seconds_whole / 300 * 1e3:.2f}, first 16 {seconds_first / 300 * 1e3:.2f}")
