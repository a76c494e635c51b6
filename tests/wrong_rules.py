"""Known-wrong verification rules, shared by the tests that show each one fails (not a test module)."""

from dataclasses import replace

import torch

from multispec.verify import Verdict, recursive_rejection, speculative_verify, without_replacement_rejection


def no_residual_verify(target_probs, draft_probs, draft_tokens, generator=None, bonus=True):
    """A known-wrong variant: on rejection it resamples from the target row instead of the residual."""
    g = draft_tokens.shape[0]
    rows = torch.arange(g)
    u = torch.rand(g, generator=generator, dtype=target_probs.dtype)
    ok = u * draft_probs[rows, draft_tokens] < target_probs[rows, draft_tokens]
    n = int(ok.cumprod(0).sum())
    nxt = int(torch.multinomial(target_probs[n], 1, generator=generator)[0])
    return Verdict(tuple(range(n)), tuple(draft_tokens[:n].tolist()), nxt, n < g)


def dedupe_rejection(target, draft, candidates, generator=None):
    """Wrong: repeated i.i.d. candidates are skipped, so the residual is not updated for them."""
    seen, keep = set(), []
    for i, t in enumerate(candidates.tolist()):
        if t not in seen:
            seen.add(t)
            keep.append(i)
    index, token = recursive_rejection(target, draft, candidates[keep], generator)
    return (None if index is None else keep[index]), token


def sorted_rejection(target, draft, candidates, generator=None):
    """Wrong: candidates drawn without replacement are verified sorted by draft probability."""
    order = torch.argsort(draft[candidates], descending=True, stable=True)
    index, token = without_replacement_rejection(target, draft, candidates[order], generator)
    return (None if index is None else int(order[index])), token


def dropping_beam_layer_verify(target_beam, draft_beam, drafts, live, width, vocab, generator=None):
    """Wrong (DSBD §4.4 item 1, the paper-literal reading): drafts whose parent was rejected are skipped
    without updating the residual, while the draft distribution is left un-renormalised."""
    from multispec.verify import beam_layer_verify

    keep = live.nonzero().flatten()
    v = beam_layer_verify(target_beam, draft_beam, drafts[keep], live[keep], width, vocab, generator)
    return replace(v, accepted=tuple(int(keep[j]) for j in v.accepted))


def reversed_ratio_layer_verify(target_beam, draft_beam, drafts, live, width, vocab, generator=None):
    """Wrong (the typo in DSBD's Algorithm 1): accept with min(1, draft / running) instead of
    running / draft."""
    from multispec.verify import beam_layer_verify

    return beam_layer_verify(draft_beam, target_beam, drafts, live, width, vocab, generator)


def target_over_draft_vocab_verify(target_probs, draft_probs, draft_tokens, generator=None, bonus=True):
    """Wrong: the target is renormalised over the draft's (reduced) vocabulary before verifying, so the tokens the
    draft cannot propose never come out."""
    g = draft_tokens.shape[0]
    if g == 0:
        return speculative_verify(target_probs, draft_probs, draft_tokens, generator, bonus)
    draft = torch.stack([draft_probs[i] for i in range(g)])
    kept = (draft > 0).any(0)
    target = torch.stack([target_probs[i] for i in range(g + 1 if bonus else g)]) * kept
    return speculative_verify(target / target.sum(-1, keepdim=True), draft, draft_tokens, generator, bonus)
