import pytest
import torch


def tiny_llama(vocab: int = 64, seed: int = 0, layers: int = 2, hidden: int = 32, max_positions: int = 128):
    """A small random Llama built from a config: real transformers code, no download."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from multispec.models.hf import HFModel

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
        eos_token_id=None, bos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).float()
    # sharpen the random output so greedy choices are not near-ties
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return HFModel(model, None, name=f"tiny-llama-{vocab}-{seed}")


@pytest.fixture(scope="session")
def default_pair():
    from multispec import load_pair

    return load_pair()
