"""The invariant step kept on disk (AOTInductor package) against the same step compiled in memory by torch.compile
(as in session 44): greedy `ar` on the default target in bfloat16, six Spec-Bench dev prompts, 64 tokens, after a
warm-up; transformers' own `generate` in the same process. One process per way:

    python benchmarks/results/compiled-invariant-packaged-s45-cpu-2core/ar_in_memory.py packaged
    MULTISPEC_KEEP_COMPILED=0 python benchmarks/results/compiled-invariant-packaged-s45-cpu-2core/ar_in_memory.py memory
"""

import json
import sys

from multispec import generate, load_pair
from multispec.bench.prompts import load_prompts
from multispec.bench.runner import hf_generate
from multispec.warp import Sampling


def main(way: str) -> None:
    pair = load_pair(dtype="bfloat16", compile="invariant")
    prompts = load_prompts(["spec-bench-dev"], None, 6, True)
    greedy = Sampling(temperature=0)
    hf_generate(pair.target, None, pair.target.encode(prompts[0].text), 64, greedy, 0)  # warm-up
    row = {"way": way}
    for method in ("hf", "ar"):
        if method == "ar":
            generate(pair.target, None, pair.target.encode(prompts[0].text), method="ar", temperature=0,
                     max_new_tokens=64, score=False)  # warm-up: the compile stays out of the rows
        tokens = seconds = 0.0
        for p in prompts:
            ids = pair.target.encode(p.text)
            if method == "hf":
                out, stats = hf_generate(pair.target, None, ids, 64, greedy, 0)
                tokens += len(out)
                seconds += stats["seconds"]
            else:
                out = generate(pair.target, None, ids, method="ar", temperature=0, max_new_tokens=64, score=False)
                tokens += len(out.token_ids)
                seconds += out.stats["seconds"]
        row[method] = round(tokens / seconds, 2)
    row["packages"] = len(pair.target._packages)
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
