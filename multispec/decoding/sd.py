"""`sd`: speculative sampling with a chain of up to `gamma` drafts (Leviathan et al. 2023; Chen et al. 2023).

propose: the drafter (`drafter=`): the draft model samples a chain (`DraftChain`, with an optional early
         stop below `confidence`), or a copying drafter proposes one deterministically (`lookup`, `suffix`),
         or `hybrid` takes a copy where one exists and the model elsewhere. With `gamma=auto` the length
         controller (`multispec.adaptive`) picks the drafter option and the chain length, zero included,
         that promises the most tokens per second;
score:   one target forward over the uncached committed token(s) and the drafts;
verify:  `multispec.verify.speculative_verify` (exact residual, bonus token);
commit:  `Session.commit`: both caches keep the accepted drafts; the new endpoint token is left uncached.
"""

from __future__ import annotations

import time
from functools import partial

from ..adaptive import DraftLength, forward_cost
from ..drafters import make_drafter
from ..engine import Session
from ..proposers import Proposer, empty_proposal
from ..verify import relaxed_verify, speculative_verify


def decode(s: Session, gamma: int | str = 4, bonus: bool = True, confidence: float = 0.0, drafter: str = "model",
           min_ngram: int = 1, max_ngram: int = 3, verify=speculative_verify, proposer=None) -> None:
    """`bonus=False` drops the free token after a fully accepted chain (seed 002's analysis setting).
    `confidence` > 0 ends a model chain early after a draft token whose unwarped draft probability is below
    it. `proposer` (hidden): a function of the session giving the proposer to use instead of the one
    `drafter` names (tests)."""
    if proposer is not None:
        proposer = proposer(s)
    else:
        proposer = make_drafter(drafter, s, tree=False, confidence=confidence, min_ngram=min_ngram,
                                max_ngram=max_ngram)
    if gamma == "auto":
        return _decode_auto(s, proposer, bonus, verify)
    while not s.done:
        g = s.draft_depth(gamma, bonus)
        _step(s, proposer, proposer.propose(s, (1,) * g), bonus, verify)


def _step(s: Session, proposer: Proposer, proposal, bonus: bool, verify):
    drafts = proposal.tokens
    # without a bonus token nothing needs the target's distribution after the last draft
    scored = drafts if bonus or drafts.shape[0] == 0 else drafts[:-1]
    target_probs = s.sampling.probs(s.target.feed(s.tokens, scored))
    verdict = verify(target_probs, proposal.draft_probs, drafts, s.generator, bonus=bonus or drafts.shape[0] == 0)
    s.commit(verdict, drafted=drafts.shape[0])
    proposer.observe(verdict)
    return verdict


def _decode_auto(s: Session, proposer: Proposer, bonus: bool, verify) -> None:
    """`gamma=auto`: each iteration the controller picks the option and length (module note of
    `multispec.adaptive`). The predicted and the measured decoding speed leave out the first iteration,
    which holds the prefill."""
    controller = DraftLength(forward_cost(s.target_model),
                             forward_cost(s.draft_model) if s.draft_model is not None else None)
    predicted_tokens = predicted_seconds = 0.0
    used: dict[str, int] = {}
    start = tokens_before = None
    while not s.done:
        room = s.draft_depth(controller.max_gamma, bonus)
        plan = controller.plan(proposer.options(s, room) if room > 0 else [], len(s.tokens),
                               len(s.tokens) - s.target.committed)
        proposal = empty_proposal(s) if plan.option is None else plan.option.make(plan.length)
        verdict = _step(s, proposer, proposal, bonus, verify)
        kind = plan.option.key.split(":")[0] if plan.option is not None else "none"
        used[kind] = used.get(kind, 0) + 1
        if plan.option is not None:
            controller.observe(plan.option.key, proposal.tokens.shape[0], len(verdict.accepted))
        if start is None:
            start, tokens_before = time.perf_counter(), len(s.tokens)
        else:
            predicted_tokens += plan.tokens
            predicted_seconds += plan.seconds
    seconds = time.perf_counter() - start
    decoded = len(s.tokens) - tokens_before
    s.info.update({
        "drafter_iterations": used,
        "predicted_tokens_per_second": predicted_tokens / predicted_seconds if predicted_seconds else None,
        "decode_tokens_per_second": decoded / seconds if decoded and seconds > 0 else None,
        "predicted_tokens": predicted_tokens, "decode_tokens": decoded,
        "predicted_seconds": predicted_seconds, "decode_seconds": seconds,
    })


def decode_relaxed(s: Session, gamma: int = 4, eps: float = 0.1, resample: str = "opt", bonus: bool = True) -> None:
    """`sd-opt`: the same loop with seed 002's over-accepting rule; eps = 0 with "opt" is `sd`."""
    decode(s, gamma, bonus, verify=partial(relaxed_verify, eps=eps, resample=resample))
