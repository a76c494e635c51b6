"""`multispec distill --eval`: how good a draft is for a target, measured before any speculative run.

On held-out prompts, along the target's own answers:
- 1 - TV at temperature 1 (the acceptance probability of one `sd` draft, Theorem 1 of Yin et al., 2024),
  along answers *sampled* from the target;
- greedy agreement (the draft's argmax equals the target's), along the target's *greedy* answers;
- the expected `sd` block efficiency for each gamma: at temperature 1 from the per-position
  acceptances, at temperature 0 from the per-position agreements (`theory.bridge.positional_calls`);
- the draft/target step-cost ratio: one-token forwards over a cached prompt, median of many.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from ...api import generate
from ..theory.bridge import positional_calls


@torch.inference_mode()
def _logits_along(model, ids: list[int], start: int) -> torch.Tensor:
    logits = model.forward(model.new_cache(), torch.tensor([ids], device=model.device))[0]
    return logits[start - 1 : len(ids) - 1].double().cpu()


@torch.inference_mode()
def step_cost(model, prompt_ids: list[int], steps: int = 32, repeats: int = 3) -> float:
    """Median seconds of a one-token forward on a cache holding the prompt."""
    times = []
    for _ in range(repeats):
        cache = model.new_cache()
        model.forward(cache, torch.tensor([prompt_ids], device=model.device), logits_to_keep=1)
        token = torch.tensor([[prompt_ids[-1]]], device=model.device)
        for _ in range(steps):
            t0 = time.perf_counter()
            model.forward(cache, token, logits_to_keep=1)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def evaluate_pair(
    target,
    draft,
    prompts: list[str],
    max_new_tokens: int = 64,
    gammas=(1, 2, 3, 4, 5, 6, 8),
    seed: int = 0,
    progress=None,
    categories: list[str] | None = None,
) -> dict:
    """`categories` (one per prompt) adds the two acceptance measures by category."""
    if categories is not None and len(categories) != len(prompts):
        raise ValueError(f"{len(categories)} categories for {len(prompts)} prompts")
    tv_accept, agree = [], []
    by_category: dict[str, dict[str, list[float]]] = {}
    calls = {"t1": {g: 0.0 for g in gammas}, "t0": {g: 0.0 for g in gammas}}
    tokens = {"t1": 0, "t0": 0}
    for i, prompt in enumerate(prompts):
        for key, temperature in (("t1", 1.0), ("t0", 0.0)):
            ref = generate(
                target,
                None,
                prompt,
                method="ar",
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                seed=seed + i,
                score=False,
            )
            if not ref.token_ids:
                continue
            seq, start = ref.prompt_ids + ref.token_ids, len(ref.prompt_ids)
            t_logits, d_logits = _logits_along(target, seq, start), _logits_along(draft, seq, start)
            if key == "t1":
                accept = 1 - 0.5 * (torch.softmax(t_logits, -1) - torch.softmax(d_logits, -1)).abs().sum(-1)
                tv_accept.extend(accept.tolist())
            else:
                accept = (t_logits.argmax(-1) == d_logits.argmax(-1)).double()
                agree.extend(accept.tolist())
            if categories is not None:
                by_category.setdefault(categories[i], {"t1": [], "t0": []})[key].extend(accept.tolist())
            acc = accept.numpy()
            tokens[key] += len(acc)
            for g in gammas:
                calls[key][g] += positional_calls(acc, g)
        if progress is not None:
            progress(i + 1, len(prompts))
    ids = target.encode(prompts[0])
    t_step, d_step = step_cost(target, ids), step_cost(draft, ids)
    report = {
        "prompts": len(prompts),
        "positions_t1": len(tv_accept),
        "positions_t0": len(agree),
        "one_minus_tv": float(np.mean(tv_accept)),
        "greedy_agreement": float(np.mean(agree)),
        "expected_block_efficiency_t1": {g: tokens["t1"] / calls["t1"][g] for g in gammas},
        "expected_block_efficiency_t0": {g: tokens["t0"] / calls["t0"][g] for g in gammas},
        "target_step_ms": 1000 * t_step,
        "draft_step_ms": 1000 * d_step,
        "step_cost_ratio": d_step / t_step,
    }
    if categories is not None:
        report["by_category"] = {
            c: {
                "prompts": categories.count(c),
                "one_minus_tv": float(np.mean(v["t1"])) if v["t1"] else None,
                "greedy_agreement": float(np.mean(v["t0"])) if v["t0"] else None,
            }
            for c, v in by_category.items()
        }
    return report


def format_report(r: dict, target_name: str, draft_name: str) -> str:
    lines = [
        f"target {target_name} / draft {draft_name}; {r['prompts']} held-out prompts",
        f"  1 - TV at temperature 1:   {r['one_minus_tv']:.3f}  ({r['positions_t1']} positions of sampled answers)",
        f"  greedy agreement:          {r['greedy_agreement']:.3f}  ({r['positions_t0']} positions of greedy answers)",
        f"  step cost: draft {r['draft_step_ms']:.1f} ms / target {r['target_step_ms']:.1f} ms = "
        f"{r['step_cost_ratio']:.3f}",
        "  expected sd block efficiency (tokens per target call) by gamma:",
    ]
    for key, label in (("t0", "temperature 0"), ("t1", "temperature 1")):
        row = ", ".join(f"{g}: {v:.2f}" for g, v in r[f"expected_block_efficiency_{key}"].items())
        lines.append(f"    {label}: {row}")
    if r.get("by_category"):
        lines.append("  by category (prompts: 1 - TV / greedy agreement):")
        for c, v in r["by_category"].items():
            tv, ag = (f"{v[k]:.3f}" if v[k] is not None else "-" for k in ("one_minus_tv", "greedy_agreement"))
            lines.append(f"    {c:<12} {v['prompts']:>3}: {tv} / {ag}")
    return "\n".join(lines)
