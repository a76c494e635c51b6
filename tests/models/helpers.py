"""Shared by the tests of the Hugging Face backend (hf/test_model, hf/test_kernels, test_static, test_packaged,
test_linears, test_cost): the prompt, a cacheless reference, a bfloat16 Llama, and a prompt scored with drafts
after it."""

import torch

from multispec.engine import Entries, ModelRunner

PROMPT = [5, 17, 3, 42, 8, 11]


def full_logits(model, ids):
    """Reference: the model run on one linear sequence with no cache."""
    with torch.no_grad():
        return model.model(torch.tensor([ids])).logits[0].float()


def _bf16_llama(hidden: int = 384, intermediate: int | None = None, heads: int | None = None):
    """A two-layer bfloat16 Llama with heads of 64 (`hidden // 64` of them unless `heads`, a third as many for
    keys and values)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from multispec.models.hf import HFModel

    torch.manual_seed(0)
    heads = heads or hidden // 64
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=intermediate or 6 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads // 3,
        head_dim=64,
        max_position_embeddings=512,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    return HFModel(LlamaForCausalLM(config).to(torch.bfloat16), None, name=f"bf16-llama-{hidden}-{intermediate}")


def _scored_after_a_prompt(model, drafts: int, step_by_step: bool) -> torch.Tensor:
    """A 200-token prompt, then `drafts` tokens: the logits after the prompt's last token and after each draft,
    from one chain fed with the prompt, or one token at a time (how `ar` reaches them)."""
    ids = torch.randint(256, (200 + drafts,), generator=torch.Generator().manual_seed(2)).tolist()
    prompt, chain = ids[:200], ids[200:]
    runner = ModelRunner(model)
    if not step_by_step:
        return runner.feed([prompt], Entries.chain(chain))[0]
    rows = [runner.feed([prompt])[0, -1]]
    for i in range(drafts):
        rows.append(runner.feed([prompt + chain[: i + 1]])[0, -1])
        runner.commit(200 + i + 1)
    return torch.stack(rows)
