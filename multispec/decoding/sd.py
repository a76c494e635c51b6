"""`sd`: speculative sampling with a chain of up to `gamma` drafts (Leviathan et al., 2023; Chen et al., 2023),
and `sd-opt`, its over-accepting variant (Yin et al., 2024: Decoding-OPT and UNO).

propose: the drafter (`drafter=`): the draft model samples a chain (`DraftChain`, with an optional early
         stop below `confidence`), or a copying drafter proposes one deterministically (`lookup`, `suffix`),
         or `hybrid` takes a copy where one exists and the model elsewhere. With `gamma=auto` the length
         controller (`multispec.drafting.length`) picks the drafter option and the chain length, zero
         included, that promises the most tokens per second;
score:   one target forward over the uncached committed token(s) and the drafts;
verify:  `speculative_verify` (exact residual, bonus token), or `relaxed_verify` for `sd-opt`;
commit:  the session commits the target; the drafter keeps its accepted drafts.
"""

from __future__ import annotations

from functools import partial

from ..drafting import make_drafter, setup_of
from ..drafting.length import AutoLength, DraftLength
from ..drafting.shape import OVERHEAD_PRIOR, PLAIN_OVERHEAD_PRIOR
from ..engine import Entries, Session
from ..models.cost import forward_cost
from ..verify import chain, greedy_verify, relaxed_verify, speculative_verify
from ..warp import LazyRows, argmax
from .loop import speculate
from .registry import BONUS, DRAFT_VOCAB, MAX_DEPTH, Method, Param, chain_entries, drafter_params, register, size


def decode(
    s: Session, *, gamma: int | str, bonus: bool, confidence: float, drafter: str, min_ngram: int, max_ngram: int
) -> None:
    proposer = make_drafter(drafter, s, tree=False, confidence=confidence, min_ngram=min_ngram, max_ngram=max_ngram)
    verify = partial(_verify, s, speculative_verify, bonus)
    if gamma != "auto":
        return speculate(s, proposer, (1,) * gamma, verify, bonus)
    # the work besides forwards priced as tree=auto prices it by default
    controller = DraftLength(
        forward_cost(s.target_model),
        forward_cost(s.draft_model, batch_invariant=False) if s.draft_model is not None else None,
        overhead=OVERHEAD_PRIOR,
        plain_overhead=PLAIN_OVERHEAD_PRIOR,
        load=getattr(s.target_model, "batch_load", None),
    )
    auto = AutoLength(
        proposer, controller, setup_of(s), lambda context: len(context) - s.target.committed, s.one_time_seconds
    )
    speculate(s, auto, (1,) * controller.max_gamma, verify, bonus)
    s.info.update(auto.report(len(s.tokens)))


def _verify(s: Session, rule, bonus: bool, proposal):
    drafts = proposal.tokens
    # without a bonus token nothing needs the target's distribution after the last draft
    scored = drafts if bonus else drafts[:-1]
    logits = s.target.feed([s.tokens], Entries.chain(scored))[0]
    if rule is speculative_verify and s.sampling.greedy:  # one-hot target rows: decided by their argmax alone
        return greedy_verify(argmax(logits), drafts, bonus=bonus)
    if logits.device.type == "cpu" and getattr(rule, "func", rule) in (chain.speculative_verify, chain.relaxed_verify):
        # these rules read rows in order up to the first rejection: on a CPU, rows made on use (on a GPU a row
        # read one at a time is a device sync each)
        draft = proposal.draft_rows if isinstance(proposal.draft_rows, LazyRows) else proposal.draft_probs
        return rule(s.sampling.rows(logits), draft, drafts, s.generator, bonus=bonus)
    return rule(s.sampling.probs(logits), proposal.draft_probs, drafts, s.generator, bonus=bonus)


def decode_relaxed(s: Session, *, gamma: int, eps: float, resample: str, bonus: bool) -> None:
    """`sd-opt`: the same loop with the over-accepting rule; eps = 0 with "opt" is `sd`."""
    proposer = make_drafter("model", s, tree=False)
    speculate(
        s,
        proposer,
        (1,) * gamma,
        partial(_verify, s, partial(relaxed_verify, eps=eps, resample=resample), bonus),
        bonus,
    )


register(
    Method(
        "sd",
        decode,
        needs_draft=True,
        exact="equals ar in distribution",
        summary="speculative sampling with a chain of gamma drafts",
        row_entries=chain_entries,
        params={
            "gamma": size(
                4,
                MAX_DEPTH,
                "drafts per target call (at most); auto: chosen each call from the "
                "target's measured cost curve and the acceptance so far",
                auto=True,
            ),
            "bonus": BONUS,
            "confidence": Param(
                float,
                0.0,
                lambda v: 0 <= v <= 1,
                "a number in [0, 1]",
                "end a chain after a draft token the draft gave less than this probability (0: always gamma drafts)",
            ),
            **drafter_params(),
        },
    )
)
register(
    Method(
        "sd-opt",
        decode_relaxed,
        needs_draft=True,
        exact="biased when eps > 0 (eps = 0 is sd)",
        summary="over-accepting speculative sampling (Decoding-OPT / UNO of Yin et al., 2024)",
        row_entries=chain_entries,
        params={
            "gamma": size(4, MAX_DEPTH, "drafts per target call"),
            "eps": Param(
                float,
                0.1,
                lambda v: 0 <= v <= 1e6,
                "a number in [0, 1e6]",
                "over-acceptance: accept with min(1, (target + eps) / draft)",
            ),
            "resample": Param(
                str,
                "opt",
                lambda v: v in ("opt", "uno"),
                "'opt' or 'uno'",
                "on rejection: the optimal residual (opt) or the target (uno)",
            ),
            "bonus": BONUS,
            "draft_vocab": DRAFT_VOCAB,
        },
    )
)
