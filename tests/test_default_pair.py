"""The embedded default pair (SmolLM2-135M-Instruct and its bfloat16 copy), through the public API."""

import pytest
import torch

from multispec import generate
from multispec.models.hf import HFModel

PROMPTS = ["Give me three tips for staying healthy.", "Translate to German: The weather is nice today."]


def test_pair_is_labelled_and_shares_one_tokenizer(default_pair):
    assert default_pair.target.vocab_size == default_pair.draft.vocab_size == 49152
    assert default_pair.draft.model.dtype == torch.bfloat16
    assert "bfloat16 copy" in " ".join(default_pair.description.values())


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_sd_reproduces_greedy_ar_token_for_token(default_pair, prompt):
    t, d = default_pair.target, default_pair.draft
    ar = generate(t, None, prompt, method="ar", temperature=0, max_new_tokens=64)
    sd = generate(t, d, prompt, method="sd", gamma=4, temperature=0, max_new_tokens=64)
    assert sd.token_ids == ar.token_ids
    assert sd.text == ar.text and len(ar.text) > 20
    # one target forward per iteration, several tokens per forward with a close draft
    assert sd.stats["target_calls"] == sd.stats["iterations"]
    assert sd.stats["block_efficiency"] > 2


def test_chat_template_by_default_and_off_on_request(default_pair):
    t = default_pair.target
    with_chat = t.encode("Hello", chat=True)
    raw = t.encode("Hello", chat=False)
    assert len(with_chat) > len(raw)
    assert t.tokenizer.decode(with_chat).startswith("<|im_start|>system")
    assert t.tokenizer.decode(raw) == "Hello"


def test_eos_ends_a_chat_answer(default_pair):
    r = generate(default_pair.target, default_pair.draft, "Say just the word yes.", method="sd",
                 temperature=0, max_new_tokens=100)
    assert r.stats["stopped"] == "eos" and r.token_ids[-1] == default_pair.target.eos_token_id
    assert len(r.token_ids) < 100


def test_sampling_is_seeded(default_pair):
    t, d = default_pair.target, default_pair.draft
    a = generate(t, d, PROMPTS[0], method="sd", max_new_tokens=24, seed=3, temperature=1.0)
    b = generate(t, d, PROMPTS[0], method="sd", max_new_tokens=24, seed=3, temperature=1.0)
    assert a.token_ids == b.token_ids


def test_draft_with_an_embedding_table_padded_past_the_tokenizer(default_pair):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152 + 64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)
    padded = HFModel(LlamaForCausalLM(config), default_pair.target.tokenizer, name="padded-draft")
    assert padded.vocab_size == 49152
    t = default_pair.target
    ar = generate(t, None, PROMPTS[1], method="ar", temperature=0, max_new_tokens=16)
    sd = generate(t, padded, PROMPTS[1], method="sd", gamma=2, temperature=0, max_new_tokens=16)
    assert sd.token_ids == ar.token_ids
