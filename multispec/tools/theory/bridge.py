"""From theory to a real model pair: predict `sd`'s acceptance and block efficiency before running it.

Theorem 1 says what matters is the TV distance between draft and target *along the target's own
samples*. For each prompt we sample a continuation from the target (the `ar` decoder), score it once
with each model, and read the per-position TV between their warped distributions. Two predictions:
- i.i.d.: with the mean acceptance a = 1 - mean TV, tau = (1 - a^(gamma+1)) / (1 - a) (Leviathan et al.);
- positional: the expected number of target calls of `sd` when position t is accepted with
  probability 1 - TV_t independently (a dynamic programme over block starts); tau = tokens / calls.
Then `sd` itself runs on the same prompts and the measured values are set beside the predictions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from ...api import generate
from ...warp import Sampling


def positional_calls(accept: np.ndarray, gamma: int) -> float:
    """Expected target calls of sd with gamma drafts and a bonus token, generating len(accept) tokens,
    when the draft at position t passes with probability accept[t] independently."""
    n = len(accept)
    calls = np.zeros(n + gamma + 2)  # calls[s]: expected calls to finish from a block start at position s
    for s in range(n - 1, -1, -1):
        g = min(gamma, n - s - 1)  # as the decoder does: keep a slot for the bonus token
        total, alive = 1.0, 1.0
        for k in range(g):
            total += alive * (1 - accept[s + k]) * calls[s + k + 1]  # rejected at s+k: resume after it
            alive *= accept[s + k]
        total += alive * calls[min(s + g + 1, n)]  # all accepted: the bonus token follows
        calls[s] = total
    return float(calls[0])


@dataclass
class BridgeRow:
    prompt: int
    tokens: int
    mean_tv: float
    predicted_acceptance: float
    predicted_tau_iid: float
    predicted_tau_positional: float
    measured_acceptance: float | None
    measured_tau: float | None


@torch.inference_mode()
def per_position_tv(target, draft, prompt_ids: list[int], continuation: list[int], sampling: Sampling) -> np.ndarray:
    """TV(draft_t, target_t) at each position of a continuation, one forward per model."""
    seq = prompt_ids + continuation
    probs = []
    for model in (target, draft):
        cache = model.new_cache()
        logits = model.forward(cache, torch.tensor([seq], device=model.device))[0]
        probs.append(sampling.probs(logits[len(prompt_ids) - 1 : len(seq) - 1].to(torch.float64).cpu()))
    return (probs[0] - probs[1]).clamp_min(0).sum(-1).numpy()


def predict_and_measure(
    target,
    draft,
    prompts: list[str],
    gamma: int = 4,
    max_new_tokens: int = 64,
    sampling: Sampling | None = None,
    seed: int = 0,
    measure: bool = True,
) -> list[BridgeRow]:
    sampling = sampling or Sampling()
    out = []
    for i, prompt in enumerate(prompts):
        kw = {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}
        ref = generate(
            target, None, prompt, method="ar", max_new_tokens=max_new_tokens, seed=seed + i, score=False, **kw
        )
        tvs = per_position_tv(target, draft, ref.prompt_ids, ref.token_ids, sampling)
        accept = 1 - tvs
        a = float(accept.mean())
        tau_iid = (1 - a ** (gamma + 1)) / (1 - a) if a < 1 else gamma + 1.0
        tau_pos = len(accept) / positional_calls(accept, gamma)
        m_acc = m_tau = None
        if measure:
            st = generate(
                target,
                draft,
                prompt,
                method="sd",
                gamma=gamma,
                max_new_tokens=max_new_tokens,
                seed=seed + 10_000 + i,
                score=False,
                **kw,
            ).stats
            examined = st["accepted"] + st["rejections"]
            m_acc = st["accepted"] / examined if examined else None
            m_tau = st["block_efficiency"]
        out.append(BridgeRow(i, len(accept), float(tvs.mean()), a, tau_iid, tau_pos, m_acc, m_tau))
    return out


def summarise(rows: list[BridgeRow]) -> dict:
    def mean(key):
        vals = [getattr(r, key) for r in rows if getattr(r, key) is not None]
        return float(np.mean(vals)) if vals else None

    keys = [
        "mean_tv",
        "predicted_acceptance",
        "predicted_tau_iid",
        "predicted_tau_positional",
        "measured_acceptance",
        "measured_tau",
    ]
    return {"prompts": len(rows), **{k: mean(k) for k in keys}, "rows": [asdict(r) for r in rows]}
