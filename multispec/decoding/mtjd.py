"""`mtjd`: exact multi-token joint decoding (MTAD's Definition 3.1, MJSD's MJGD), the reference the joint
methods approximate.

Each step emits a block of `gamma` tokens drawn from the target's joint distribution over all |V|^gamma
blocks, warped as a whole (temperature, top-k, top-p on the block); at temperature 0 the block is the
joint argmax. With `bonus`, one token from the warped target follows each block, as the joint methods'
verification draws one (what `mjsd` with a perfect draft and a wide beam produces).

It enumerates every block from the exact tables of a `MarkovLM`, so it runs only on those small test
models and makes no model forwards (target_calls stays 0; `iterations` counts the blocks).
"""

from __future__ import annotations

import torch

from ..engine import Session
from ..models.markov import MarkovLM
from .registry import MAX_DEPTH, Method, Param, register, size

MAX_BLOCKS = 1 << 20


def check_model(target, gamma: int) -> None:
    if not isinstance(target, MarkovLM):
        raise ValueError(
            f"mtjd enumerates every block exactly and runs only on MarkovLM test models, not on "
            f"{getattr(target, 'name', type(target).__name__)!r}; use mjsd or mtad on a real model"
        )
    blocks = target.vocab_size**gamma
    if blocks > MAX_BLOCKS:
        raise ValueError(
            f"mtjd would enumerate {target.vocab_size}^{gamma} = {blocks} blocks, more than {MAX_BLOCKS}; lower gamma"
        )


def block_log_likelihoods(target: MarkovLM, last_token: int, position: int, k: int) -> torch.Tensor:
    """[V**k] log target(block | context) for every block of k tokens after `last_token` at `position`,
    blocks in lexicographic order (block index = its tokens as base-V digits)."""
    vocab = target.vocab_size
    joint = torch.log(target.conditionals(position)[last_token])  # [V]
    for i in range(1, k):
        previous = torch.arange(joint.numel()) % vocab  # the last token of each block so far
        step = torch.log(target.conditionals(position + i))[previous]  # [V**i, V]
        joint = (joint[:, None] + step).reshape(-1)
    return joint


def decode(s: Session, *, gamma: int, bonus: bool) -> None:
    target = s.target_model
    check_model(target, gamma)
    vocab = target.vocab_size
    while not s.done:
        k = min(gamma, s.budget())
        position = len(s.tokens) - 1
        joint = block_log_likelihoods(target, s.tokens[-1], position, k)
        index = int(s.sample(s.sampling.probs(joint)))
        block = [(index // vocab ** (k - 1 - i)) % vocab for i in range(k)]
        s.append(block)
        if bonus and not s.done:
            row = torch.log(target.conditionals(len(s.tokens) - 1)[s.tokens[-1]])
            s.append([int(s.sampling.next_token(row, s.generator))])
        s.counters["iterations"] += 1


register(
    Method(
        "mtjd",
        decode,
        needs_draft=False,
        exact="reference: the target's exact joint over blocks",
        summary="exact multi-token joint decoding by enumerating every block (MarkovLM test models only)",
        params={
            "gamma": size(4, MAX_DEPTH, "tokens per block"),
            "bonus": Param(
                bool,
                False,
                rule="true or false",
                help="one token from the target after each block, as the joint methods draw one",
            ),
        },
        markov_only=True,
    )
)
