"""In one process, alternating: sd at T = 1 with the target rows softmaxed at once and the draft rows stacked
(`old`, the engine before 0b5f7f4) against rows made on use (`new`). Run from the repository root:

    python benchmarks/results/iteration-work-s34-cpu-2core/ab.py
"""

import statistics

import multispec.decoding.sd as sd
from multispec.api import generate, load_pair
from multispec.engine import Entries

PROMPT = "Explain how a bicycle gear system works, in detail."


def old(s, rule, bonus, proposal):
    drafts = proposal.tokens
    scored = drafts if bonus else drafts[:-1]
    logits = s.target.feed([s.tokens], Entries.chain(scored))[0]
    return rule(s.sampling.probs(logits), proposal.draft_probs, drafts, s.generator, bonus=bonus)


def main() -> None:
    pair = load_pair()
    new = sd._verify
    for g in (1, 4):  # warm-up
        generate(pair.target, pair.draft, PROMPT, method="sd", gamma=g, max_new_tokens=24, temperature=1.0, seed=1,
                 score=False)
    other: dict[tuple[int, str], list[float]] = {}
    for rep in range(4):
        for g in (1, 4):
            for name, verify in (("old", old), ("new", new)):
                sd._verify = verify
                r = generate(pair.target, pair.draft, PROMPT, method="sd", gamma=g, max_new_tokens=64,
                             temperature=1.0, seed=rep, score=False)
                other.setdefault((g, name), []).append(1e3 * r.stats["other_seconds"] / max(1, r.stats["iterations"]))
    for (g, name), v in sorted(other.items()):
        print(f"sd gamma={g} {name}: other ms/iteration {[round(x, 2) for x in v]}, median {statistics.median(v):.2f}")


if __name__ == "__main__":
    main()
