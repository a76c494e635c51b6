"""The draft's shape and initialisation.

A narrow Llama with the target's tokenizer, rotary settings and special tokens, and a tied head. At
batch size 1 on a CPU the (vocabulary x width) head dominates a small model's step, so width buys
cost linearly while a few layers are cheap.

Two initialisations:

- `"embeddings"`: the embedding table is the target's projected on its top principal directions; the
  layers start random (the first run's draft; a fresh draft spends most of its training learning what
  the target's layers already know).
- `"sliced"` (default): the draft *is* the target's first `layers` layers, rotated into the principal
  directions of the target's residual stream and cut to `hidden` of them. The RMSNorm gains are folded
  into the linear maps that read the normalised stream (so the rotation commutes with the norm), and
  the attention heads and MLP keep their full inner widths, so every inherited weight is the target's
  own, seen through the projection. Deep layers are dropped: they do not survive the cut (keeping the
  last layer gives near-zero agreement), training rebuilds the way to the head.
"""

from __future__ import annotations

import math

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def draft_config(
    target_config,
    hidden: int = 192,
    layers: int = 4,
    heads: int | None = None,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    head_dim: int | None = None,
) -> LlamaConfig:
    """The draft's config; heads, kv heads, head width and MLP width default to the target's."""
    heads = heads or target_config.num_attention_heads
    kv_heads = kv_heads or target_config.num_key_value_heads
    if heads % kv_heads:
        raise ValueError(f"--heads {heads} must be divisible by --kv-heads {kv_heads}")
    rope = getattr(target_config, "rope_parameters", None) or {
        "rope_type": "default",
        "rope_theta": getattr(target_config, "rope_theta", 10000.0),
    }
    return LlamaConfig(
        vocab_size=target_config.vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate or target_config.intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim
        or getattr(target_config, "head_dim", None)
        or target_config.hidden_size // target_config.num_attention_heads,
        max_position_embeddings=target_config.max_position_embeddings,
        rope_parameters=dict(rope),
        rms_norm_eps=target_config.rms_norm_eps,
        tie_word_embeddings=True,
        bos_token_id=target_config.bos_token_id,
        eos_token_id=target_config.eos_token_id,
        pad_token_id=target_config.pad_token_id,
    )


@torch.no_grad()
def residual_basis(target_model, samples: list[torch.Tensor], layers: int) -> torch.Tensor:
    """Principal directions [H, H] (largest first) of the target's residual stream on `samples`: the
    inputs of its first `layers` layers and the stream that reaches its head, each weighted equally."""
    size = target_model.config.hidden_size
    moment = torch.zeros(size, size, dtype=torch.float64)
    for ids in samples:
        states = target_model(ids[None].long(), output_hidden_states=True, use_cache=False).hidden_states
        for h in [*states[: layers + 1], states[-1]]:
            h = h[0].double()
            m = h.T @ h
            moment += m / m.trace()
    _, vectors = torch.linalg.eigh(moment)
    return vectors.flip(-1).float()


def _check_sliceable(target_model, config: LlamaConfig) -> None:
    t = target_model.config
    if (
        getattr(t, "model_type", None) != "llama"
        or getattr(t, "attention_bias", False)
        or getattr(t, "mlp_bias", False)
    ):
        raise ValueError("the sliced initialisation needs a Llama-style target without biases; use init='embeddings'")
    own = (config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.intermediate_size)
    theirs = (
        t.num_attention_heads,
        t.num_key_value_heads,
        getattr(t, "head_dim", t.hidden_size // t.num_attention_heads),
        t.intermediate_size,
    )
    if own != theirs:
        raise ValueError(f"the sliced initialisation keeps the target's heads and MLP width {theirs}, got {own}")
    if config.num_hidden_layers > t.num_hidden_layers or config.hidden_size > t.hidden_size:
        raise ValueError("the draft cannot be deeper or wider than the target it is sliced from")


@torch.no_grad()
def build_draft(
    target_model, config: LlamaConfig, seed: int = 0, init: str = "sliced", samples: list[torch.Tensor] | None = None
) -> LlamaForCausalLM:
    """A fresh draft for `target_model`; `samples` (token id tensors) set the residual basis of "sliced"."""
    torch.manual_seed(seed)
    draft = LlamaForCausalLM(config).float()
    table = target_model.get_input_embeddings().weight.float()  # [V, H_target]
    n = min(table.shape[0], config.vocab_size)
    width = config.hidden_size
    if init == "embeddings":
        # principal directions of the target's token embeddings (an [H, H] eigenproblem, not a [V, H] SVD)
        _, vectors = torch.linalg.eigh(table.T @ table)
        basis = vectors[:, -width:].flip(-1)
        draft.get_input_embeddings().weight[:n] = (table @ basis)[:n]
        draft.tie_weights()
        # random layers leave the stream mostly the input token's embedding, which the tied head would turn
        # into a confident "repeat the last token"; a small final norm starts near uniform
        draft.model.norm.weight.fill_(0.1)
        return draft
    if init != "sliced":
        raise ValueError(f"unknown init {init!r}: expected 'sliced' or 'embeddings'")
    _check_sliceable(target_model, config)
    if not samples:
        raise ValueError("the sliced initialisation needs sample token sequences for the residual basis")
    basis = residual_basis(target_model, samples, config.num_hidden_layers)[:, :width]  # [H, d]
    # a normalised stream x / rms_H(x) with x = basis @ z equals sqrt(H / d) * basis @ (z / rms_d(z))
    scale = math.sqrt(table.shape[1] / width)
    draft.get_input_embeddings().weight[:n] = (table @ basis)[:n]
    for mine, theirs in zip(draft.model.layers, target_model.model.layers, strict=False):
        g_attn = theirs.input_layernorm.weight.float()
        g_mlp = theirs.post_attention_layernorm.weight.float()
        for name in ("q_proj", "k_proj", "v_proj"):
            w = getattr(theirs.self_attn, name).weight.float()
            getattr(mine.self_attn, name).weight.copy_(scale * (w * g_attn) @ basis)
        mine.self_attn.o_proj.weight.copy_(basis.T @ theirs.self_attn.o_proj.weight.float())
        for name in ("gate_proj", "up_proj"):
            w = getattr(theirs.mlp, name).weight.float()
            getattr(mine.mlp, name).weight.copy_(scale * (w * g_mlp) @ basis)
        mine.mlp.down_proj.weight.copy_(basis.T @ theirs.mlp.down_proj.weight.float())
        mine.input_layernorm.weight.fill_(1.0)
        mine.post_attention_layernorm.weight.fill_(1.0)
    # the tied head reads (table @ basis) @ (g' * z_hat); the target reads table @ (g * x_hat): match the
    # diagonal of g seen through the basis
    g_final = target_model.model.norm.weight.float()
    draft.model.norm.weight.copy_(scale * ((basis * g_final[:, None]) * basis).sum(0))
    draft.tie_weights()
    return draft


@torch.no_grad()
def mlp_importance(draft, samples: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per layer, each MLP unit's mean |activation| on `samples` times the norm of what it writes back:
    the size of its contribution to the residual stream."""
    totals = [torch.zeros(layer.mlp.down_proj.in_features) for layer in draft.model.layers]

    def hook(i):
        def record(module, inputs, output):  # returns None: the layer's output is left alone
            totals[i].add_(inputs[0].detach().float().abs().flatten(0, -2).sum(0))

        return record

    hooks = [layer.mlp.down_proj.register_forward_hook(hook(i)) for i, layer in enumerate(draft.model.layers)]
    try:
        for ids in samples:
            draft(ids[None].long(), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return [
        t * layer.mlp.down_proj.weight.float().norm(dim=0) for t, layer in zip(totals, draft.model.layers, strict=True)
    ]


@torch.no_grad()
def reshape_draft(draft, layers: int, intermediate: int, samples: list[torch.Tensor], seed: int = 0):
    """A trained draft with more layers and/or a narrower MLP, computing nearly what it computed.

    The MLP keeps, in every layer, the `intermediate` units that contribute most on `samples` (pruning is
    the only lossy part). New layers go on top and start as the identity: random input maps, zero output
    maps (o_proj, down_proj), so the stream reaching the head is unchanged until training moves them.
    """
    old = draft.config
    if layers < old.num_hidden_layers:
        raise ValueError(
            f"--layers {layers} is fewer than the {old.num_hidden_layers} layers of the draft being "
            "continued; reshaping only adds layers"
        )
    if intermediate > old.intermediate_size:
        raise ValueError(
            f"--intermediate {intermediate} is wider than the draft's MLP ({old.intermediate_size}); "
            "reshaping only narrows it"
        )
    if intermediate < 1:
        raise ValueError(f"--intermediate must be >= 1, got {intermediate}")
    keep = [s.topk(intermediate).indices.sort().values for s in mlp_importance(draft, samples)]
    config = LlamaConfig(**{**old.to_dict(), "num_hidden_layers": layers, "intermediate_size": intermediate})
    torch.manual_seed(seed)
    grown = LlamaForCausalLM(config).to(draft.dtype)
    state = draft.state_dict()
    for i, k in enumerate(keep):
        for name in ("gate_proj", "up_proj"):
            state[f"model.layers.{i}.mlp.{name}.weight"] = state[f"model.layers.{i}.mlp.{name}.weight"][k]
        state[f"model.layers.{i}.mlp.down_proj.weight"] = state[f"model.layers.{i}.mlp.down_proj.weight"][:, k]
    for layer in grown.model.layers[old.num_hidden_layers :]:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    missing, unexpected = grown.load_state_dict(state, strict=False)
    if unexpected or any(not m.startswith("model.layers.") for m in missing):
        raise RuntimeError(f"reshaping lost weights: missing {missing}, unexpected {unexpected}")
    grown.tie_weights()
    return grown
