"""The embedded default pair (SmolLM2-135M-Instruct and its shipped trained draft), through the public API."""

import pytest
import torch

from multispec import generate
from multispec.models.hf import HFModel

PROMPTS = ["Give me three tips for staying healthy.", "Translate to German: The weather is nice today."]


def test_pair_is_labelled_and_shares_one_tokenizer(default_pair):
    from multispec.models.default import DRAFT_NAME

    assert default_pair.target.vocab_size == default_pair.draft.vocab_size == 49152
    from multispec.models.hf import default_dtype

    # bfloat16 where this machine has fast bfloat16, else float32; the same for both models
    assert default_pair.draft.name == DRAFT_NAME and default_pair.draft.model.dtype == default_dtype()
    assert default_pair.target.model.dtype == default_dtype()
    assert "distilled" in default_pair.description[DRAFT_NAME]


def test_shipped_draft_is_a_small_ordinary_checkpoint():
    from transformers import AutoModelForCausalLM

    from multispec.models.default import DRAFT_DIR

    files = sorted(p.name for p in DRAFT_DIR.iterdir())
    assert "config.json" in files and "model.safetensors" in files
    assert sum(p.stat().st_size for p in DRAFT_DIR.iterdir()) <= 30_000_000
    model = AutoModelForCausalLM.from_pretrained(DRAFT_DIR)  # plain transformers, no multispec code
    assert model.dtype == torch.bfloat16 and model.config.vocab_size == 49152


def test_shipped_draft_is_trained_towards_the_target(default_pair):
    # along the target's own greedy answer, the shipped draft's argmax agrees far more often than the
    # same architecture with fresh random weights (which agrees on next to nothing)
    from transformers import AutoModelForCausalLM

    t, d = default_pair.target, default_pair.draft
    ref = generate(t, None, PROMPTS[0], method="ar", temperature=0, max_new_tokens=48)
    seq, start = ref.prompt_ids + ref.token_ids, len(ref.prompt_ids)

    def agreement(model):
        with torch.no_grad():
            logits = model.forward(model.new_cache(), torch.tensor([seq]))[0, start - 1 : -1]
        return float((logits.argmax(-1) == want).float().mean())

    with torch.no_grad():
        want = t.forward(t.new_cache(), torch.tensor([seq]))[0, start - 1 : -1].argmax(-1)
    torch.manual_seed(0)
    fresh = HFModel(AutoModelForCausalLM.from_config(d.model.config), t.tokenizer, name="fresh")
    trained, untrained = agreement(d), agreement(fresh)
    assert trained >= 0.15 and untrained <= 0.05, (
        trained,
        untrained,
    )  # measured: 0.21 (0.19 for the third run) and 0.0


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_sd_reproduces_greedy_ar_token_for_token(default_pair_f32, prompt):
    t, d = default_pair_f32.target, default_pair_f32.draft
    ar = generate(t, None, prompt, method="ar", temperature=0, max_new_tokens=64)
    sd = generate(t, d, prompt, method="sd", gamma=4, temperature=0, max_new_tokens=64)
    assert sd.token_ids == ar.token_ids
    assert sd.text == ar.text and len(ar.text) > 20
    # one target forward per iteration, and drafts accepted: fewer target calls than tokens
    assert sd.stats["target_calls"] == sd.stats["iterations"]
    assert sd.stats["block_efficiency"] > 1.2


def test_bfloat16_copy_stays_available_by_name():
    from multispec import load_pair
    from multispec.models.default import BF16_DRAFT_NAME

    pair = load_pair(draft=BF16_DRAFT_NAME)
    assert pair.draft.model.dtype == torch.bfloat16
    ar = generate(pair.target, None, PROMPTS[1], method="ar", temperature=0, max_new_tokens=32)
    sd = generate(pair.target, pair.draft, PROMPTS[1], method="sd", gamma=4, temperature=0, max_new_tokens=32)
    assert sd.token_ids == ar.token_ids and sd.stats["block_efficiency"] > 2  # a near-copy: most drafts accepted


def test_chat_template_by_default_and_off_on_request(default_pair):
    t = default_pair.target
    with_chat = t.encode("Hello", chat=True)
    raw = t.encode("Hello", chat=False)
    assert len(with_chat) > len(raw)
    assert t.tokenizer.decode(with_chat).startswith("<|im_start|>system")
    assert t.tokenizer.decode(raw) == "Hello"


def test_eos_ends_a_chat_answer(default_pair):
    r = generate(
        default_pair.target,
        default_pair.draft,
        "Say just the word yes.",
        method="sd",
        temperature=0,
        max_new_tokens=100,
    )
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
    config = LlamaConfig(
        vocab_size=49152 + 64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    )
    padded = HFModel(LlamaForCausalLM(config), default_pair.target.tokenizer, name="padded-draft")
    assert padded.vocab_size == 49152
    t = default_pair.target
    ar = generate(t, None, PROMPTS[1], method="ar", temperature=0, max_new_tokens=16)
    sd = generate(t, padded, PROMPTS[1], method="sd", gamma=2, temperature=0, max_new_tokens=16)
    assert sd.token_ids == ar.token_ids


@pytest.mark.slow
def test_the_target_writes_its_own_prompts(default_pair):
    from multispec.tools.distill.teacher import self_written_prompts, user_turn_prefix

    target = default_pair.target
    prefix = user_turn_prefix(target.tokenizer)
    assert prefix.endswith("<|im_start|>user\n") and "system" in prefix
    first = self_written_prompts(target, 6, batch_size=8, max_new_tokens=64, seed=3)
    assert 0 < len(first) <= 6 and len(set(first)) == len(first)
    assert all(len(p.split()) >= 4 and "<|im" not in p for p in first)
    # same seed, same prompts; also when the writing is interrupted after its first batch and continued
    states = []
    again = self_written_prompts(target, 6, batch_size=4, max_new_tokens=64, seed=3, on_batch=states.append)
    assert states and states[-1]["prompts"][:6] == again and len(states[0]["prompts"]) <= 4
    resumed = []
    assert (
        self_written_prompts(
            target, 6, batch_size=4, max_new_tokens=64, seed=3, state=states[0], on_batch=resumed.append
        )
        == again
    )
    assert resumed[0]["batches"] == 2  # the first batch was not written again
    # another seed writes other prompts (with seed + batch, seed 4's first batch was seed 3's second)
    assert not set(self_written_prompts(target, 6, batch_size=4, max_new_tokens=64, seed=4)) & set(again)
    # `keep` filters (the contamination check goes there): refusing all leaves none, after bounded tries
    assert self_written_prompts(target, 2, batch_size=2, max_new_tokens=8, keep=lambda text: False) == []


def test_self_prompts_need_a_chat_template(default_pair):
    from multispec.tools.distill.teacher import user_turn_prefix

    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="chat template"):
        user_turn_prefix(NoTemplate())


@pytest.mark.slow
def test_distill_holds_out_self_written_prompts(default_pair, tmp_path):
    # a run on self-written prompts writes as many more as it holds out, and logs a second held-out curve
    # on them (the pool's held-out set does not track the chat distribution such a run aims at)
    import json

    from multispec.tools.distill import DistillConfig, TrainConfig, distill
    from multispec.tools.distill.teacher import load_rows

    target = default_pair.target
    cfg = DistillConfig(
        prompts=0,
        self_prompts=3,
        heldout_prompts=2,
        gen_batch=8,
        max_new_tokens=6,
        hidden=32,
        layers=1,
        heads=2,
        kv_heads=1,
        init="embeddings",
        train=TrainConfig(steps=2, batch_tokens=16, warmup=1, eval_every=1),
    )
    out, lines = tmp_path / "run", []
    distill(target, out, cfg, say=lines.append)
    written = json.loads((out / "self-prompts.json").read_text())["prompts"]
    assert len(written) == 5
    trained = {tuple(r["prompt_ids"].tolist()) for r in load_rows(sorted((out / "data").glob("shard-*.pt")))}
    held = load_rows(sorted((out / "heldout-self").glob("shard-*.pt")))
    assert trained == {tuple(target.encode(p, chat=True)) for p in written[:3]}
    assert {tuple(r["prompt_ids"].tolist()) for r in held} == {tuple(target.encode(p, chat=True)) for p in written[3:]}
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [0, 1, 2]
    assert all(0 < e["eval_self_positions"] and 0 <= e["eval_self_greedy_agreement"] <= 1 for e in log)
    assert any("; self: 1-TV" in m for m in lines)


def test_bfloat16_teacher_is_a_close_copy_of_the_target(default_pair_f32):
    from multispec.tools.distill import _teacher

    target = default_pair_f32.target
    assert _teacher(target, "float32") is target
    teacher = _teacher(target, "bfloat16")
    assert teacher.dtype == torch.bfloat16 and target.dtype == torch.float32  # a copy: the target is untouched
    ids = torch.tensor([target.encode(PROMPTS[0], chat=True)])
    with torch.inference_mode():
        exact = torch.softmax(target.model(ids).logits[0, -16:].float(), -1)
        close = torch.softmax(teacher.model(ids).logits[0, -16:].float(), -1)
    tv = 0.5 * (exact - close).abs().sum(-1)
    assert 0 < float(tv.mean()) < 0.05
    with pytest.raises(ValueError, match="teacher dtype"):
        _teacher(target, "int8")
