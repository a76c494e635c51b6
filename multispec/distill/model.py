"""The draft's shape and initialisation.

A narrow Llama with the target's tokenizer, rotary settings and special tokens, and a tied head. At
batch size 1 on a CPU the (vocabulary x width) head dominates a small model's step, so width buys
cost linearly while a few layers are cheap; 224 wide x 5 layers costs about a sixth of a SmolLM2-135M
step here and stays under 30 MB in bfloat16.

Initialisation: the embedding table is the target's projected onto its top principal directions
(SVD of the target's table), so from step 0 the draft's tokens sit where the target's do, up to the
dropped directions; the layers start random and the final norm small (near-uniform first outputs).
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def draft_config(target_config, hidden: int = 224, layers: int = 5, heads: int = 4, kv_heads: int = 2,
                 intermediate: int | None = None) -> LlamaConfig:
    if hidden % heads:
        raise ValueError(f"--hidden {hidden} must be divisible by --heads {heads}")
    if heads % kv_heads:
        raise ValueError(f"--heads {heads} must be divisible by --kv-heads {kv_heads}")
    rope = getattr(target_config, "rope_parameters", None) or {"rope_type": "default",
                                                               "rope_theta": getattr(target_config, "rope_theta", 10000.0)}
    return LlamaConfig(
        vocab_size=target_config.vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate or 3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=target_config.max_position_embeddings,
        rope_parameters=dict(rope),
        rms_norm_eps=target_config.rms_norm_eps,
        tie_word_embeddings=True,
        bos_token_id=target_config.bos_token_id,
        eos_token_id=target_config.eos_token_id,
        pad_token_id=target_config.pad_token_id,
    )


@torch.no_grad()
def build_draft(target_model, config: LlamaConfig, seed: int = 0) -> LlamaForCausalLM:
    """A fresh draft whose embedding table is the target's, projected to the draft's width."""
    torch.manual_seed(seed)
    draft = LlamaForCausalLM(config).float()
    table = target_model.get_input_embeddings().weight.float()  # [V, H_target]
    # principal directions of the target's token embeddings (an [H, H] eigenproblem, not a [V, H] SVD)
    _, vectors = torch.linalg.eigh(table.T @ table)
    basis = vectors[:, -config.hidden_size :].flip(-1)  # [H_target, hidden], largest first
    projected = table @ basis
    n = min(projected.shape[0], draft.get_input_embeddings().weight.shape[0])
    draft.get_input_embeddings().weight[:n] = projected[:n]
    draft.tie_weights()
    # with random layers the residual stream is mostly the input token's own embedding, which the tied
    # head would turn into a confident "repeat the last token"; a small final norm starts near uniform
    draft.model.norm.weight.fill_(0.1)
    return draft
