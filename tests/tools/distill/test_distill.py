"""Draft distillation: the loss, the initialisation, the whole pipeline (data, training, checkpoints,
resume, export) on a tiny random target with the real SmolLM2 tokenizer, and the pair evaluation."""

import json

import numpy as np
import pytest
import torch

from multispec.entrypoints.cli import main
from multispec.models.hf import HFModel
from multispec.models.vocab import read_token_counts
from multispec.tools.distill import (
    DistillConfig,
    TrainConfig,
    build_draft,
    count_tokens,
    distill,
    draft_config,
    mt_bench_prompts,
)
from multispec.tools.distill.evaluate import evaluate_pair
from multispec.tools.distill.model import mlp_importance, reshape_draft
from multispec.tools.distill.prompts import Contamination, prompt_pool
from multispec.tools.distill.teacher import load_rows
from multispec.tools.distill.train import coarse_kl, train


def test_coarse_kl_is_the_kl_of_the_bucketed_distributions():
    rng = np.random.default_rng(0)
    V, K = 40, 6
    target = rng.dirichlet(np.full(V, 0.3), size=5)
    draft_logits = torch.tensor(rng.normal(size=(5, V)))
    draft = torch.softmax(draft_logits, -1).numpy()
    top = np.argsort(-target, -1)[:, :K]
    top_logp = torch.tensor(np.log(np.take_along_axis(target, top, -1)))
    got = coarse_kl(draft_logits, torch.tensor(top), top_logp).numpy()
    for i in range(5):
        p = np.append(target[i, top[i]], 1 - target[i, top[i]].sum())
        q = np.append(draft[i, top[i]], 1 - draft[i, top[i]].sum())
        assert got[i] == pytest.approx(float((p * np.log(p / q)).sum()), rel=1e-4)
    # all tokens kept: the full KL; the target itself: zero
    full = np.argsort(-target, -1)
    full_logp = torch.tensor(np.log(np.take_along_axis(target, full, -1)))
    exact = (target * np.log(target / draft)).sum(-1)
    assert np.allclose(coarse_kl(draft_logits, torch.tensor(full), full_logp).numpy(), exact, rtol=1e-4, atol=1e-6)
    assert np.allclose(coarse_kl(torch.tensor(np.log(target)), torch.tensor(top), top_logp).numpy(), 0, atol=1e-6)


def _tiny_target(tokenizer, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():
        model.model.norm.weight.fill_(4.0)  # a random model with some confidence, so argmaxes are not ties
    return HFModel(model, tokenizer, name=f"tiny-target-{seed}")


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from multispec.models.default import converted_checkpoint

    return AutoTokenizer.from_pretrained(converted_checkpoint())


def test_draft_embeddings_are_the_targets_principal_projection(tokenizer):
    target = _tiny_target(tokenizer)
    config = draft_config(target.model.config, hidden=16, layers=1, heads=2, kv_heads=1)
    draft = build_draft(target.model, config, init="embeddings")
    table = target.model.get_input_embeddings().weight.detach()
    emb = draft.get_input_embeddings().weight.detach()
    assert emb.shape == (table.shape[0], 16)
    assert draft.lm_head.weight.data_ptr() == emb.data_ptr()  # tied head
    # the projection keeps more of the table's energy than any other 16-dim projection, e.g. a random one
    random_basis = torch.linalg.qr(torch.randn(table.shape[1], 16))[0]
    assert emb.norm() > (table @ random_basis).norm()
    u, s, vh = torch.linalg.svd(table, full_matrices=False)
    assert emb.norm() ** 2 == pytest.approx(float((s[:16] ** 2).sum()), rel=1e-3)


def _with_random_gains(target, seed=0):
    """Non-uniform RMSNorm gains inside the layers, so an unfolded gain would show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in target.model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.copy_(0.5 + torch.rand(norm.weight.shape, generator=g))
    return target


def test_sliced_draft_at_full_width_and_depth_is_the_target(tokenizer):
    # rotating the residual stream into any orthonormal basis, with the norm gains folded into the maps
    # that read the stream, leaves the model's function unchanged; only the final norm's gain is
    # approximated (it meets a tied head), so it is uniform here
    target = _with_random_gains(_tiny_target(tokenizer))
    ids = torch.tensor(tokenizer("A short sentence to compare the two models on.")["input_ids"])
    config = draft_config(target.model.config, hidden=48, layers=2)
    draft = build_draft(target.model, config, samples=[ids])
    with torch.no_grad():
        want = target.model(ids[None]).logits
        got = draft(ids[None]).logits
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
        # the inherited weights really are the target's: a draft whose gains were not folded differs
        for layer in draft.model.layers:
            layer.input_layernorm.weight.fill_(1.3)
        assert not torch.allclose(draft(ids[None]).logits, want, atol=1e-2)


def test_reshaped_draft_gains_identity_layers_and_keeps_its_strongest_mlp_units(tokenizer):
    model = _with_random_gains(_tiny_target(tokenizer)).model  # a trained draft stand-in: 2 layers, MLP 96
    ids = torch.tensor(tokenizer("Some words to weigh the MLP units with, and then some more words.")["input_ids"])
    with torch.no_grad():
        want = model(ids[None]).logits
        deeper = reshape_draft(model, layers=4, intermediate=96, samples=[ids])
        assert len(deeper.model.layers) == 4
        # the new layers read the stream through random maps but write nothing yet: the same function
        assert deeper.model.layers[3].mlp.up_proj.weight.abs().sum() > 0
        assert torch.allclose(deeper(ids[None]).logits, want, atol=1e-5)
        assert deeper.lm_head.weight.data_ptr() == deeper.get_input_embeddings().weight.data_ptr()

        narrow = reshape_draft(model, layers=2, intermediate=48, samples=[ids])
        assert narrow.model.layers[0].mlp.down_proj.weight.shape == (48, 48)
        assert narrow.config.intermediate_size == 48
        # keeping the units that contribute most loses less than keeping those that contribute least
        weakest = reshape_draft(model, layers=2, intermediate=48, samples=[ids])
        for layer, src, scores in zip(
            weakest.model.layers, model.model.layers, mlp_importance(model, [ids]), strict=True
        ):
            k = scores.topk(48, largest=False).indices.sort().values
            src = src.mlp
            layer.mlp.gate_proj.weight.copy_(src.gate_proj.weight[k])
            layer.mlp.up_proj.weight.copy_(src.up_proj.weight[k])
            layer.mlp.down_proj.weight.copy_(src.down_proj.weight[:, k])
        kept_error = (narrow(ids[None]).logits - want).abs().mean()
        assert kept_error < (weakest(ids[None]).logits - want).abs().mean()
    with pytest.raises(ValueError, match="only adds layers"):
        reshape_draft(model, layers=1, intermediate=96, samples=[ids])
    with pytest.raises(ValueError, match="only narrows"):
        reshape_draft(model, layers=2, intermediate=128, samples=[ids])


def test_sliced_draft_cut_to_fewer_directions_and_layers(tokenizer):
    target = _with_random_gains(_tiny_target(tokenizer))
    ids = torch.tensor(tokenizer("Another sentence, used to measure the residual stream.")["input_ids"])
    draft = build_draft(target.model, draft_config(target.model.config, hidden=24, layers=1), samples=[ids])
    assert draft.config.hidden_size == 24 and len(draft.model.layers) == 1
    assert draft.model.layers[0].self_attn.q_proj.weight.shape == (48, 24)  # the target's heads, read from 24 dims
    assert draft.lm_head.weight.data_ptr() == draft.get_input_embeddings().weight.data_ptr()
    with pytest.raises(ValueError, match="heads"):
        build_draft(
            target.model, draft_config(target.model.config, hidden=24, layers=1, heads=2, kv_heads=1), samples=[ids]
        )
    with pytest.raises(ValueError, match="sample"):
        build_draft(target.model, draft_config(target.model.config, hidden=24, layers=1))
    with pytest.raises(ValueError, match="unknown init"):
        build_draft(target.model, draft_config(target.model.config, hidden=24, layers=1), init="zeros")


@pytest.mark.slow
def test_distill_pipeline_trains_checkpoints_resumes_and_exports(tokenizer, tmp_path):
    target = _tiny_target(tokenizer)
    # random layers (init="embeddings"), so that there is something to learn: a sliced draft of this tiny
    # random target starts almost equal to it
    cfg = DistillConfig(
        prompts=8,
        heldout_prompts=4,
        gen_batch=4,
        max_new_tokens=12,
        hidden=32,
        layers=1,
        heads=2,
        kv_heads=1,
        init="embeddings",
        train=TrainConfig(steps=12, batch_tokens=40, lr=1e-2, warmup=2, eval_every=6, checkpoint_every=6),
    )
    out = tmp_path / "run"
    lines = []
    last = distill(target, out, cfg, say=lines.append)
    shards = sorted((out / "data").glob("shard-*.pt"))
    assert len(shards) == 2 and len(list((out / "heldout").glob("shard-*.pt"))) == 1
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [0, 6, 12]
    assert log[-1]["eval_coarse_kl"] < log[0]["eval_coarse_kl"]  # it learns the target
    assert last["step"] == 12

    # the saved draft is an ordinary transformers checkpoint with the target's tokenizer
    reloaded = HFModel.from_pretrained(str(out / "draft"))
    assert reloaded.vocab_size == target.vocab_size
    assert reloaded.tokenizer.get_vocab() == tokenizer.get_vocab()
    # ... with the counts of the target's training answers, which a reduced draft vocabulary ranks by
    answers = torch.cat([r["ids"].long() for r in load_rows(shards)])
    assert torch.equal(reloaded.token_counts, torch.bincount(answers, minlength=target.vocab_size))

    # the counts alone, for a draft trained elsewhere: the same teacher answers (reused here), counted
    written = [p.stat().st_mtime_ns for p in shards]
    path = count_tokens(target, out, cfg, say=lines.append)
    assert path == out / "token_counts.safetensors"
    assert [p.stat().st_mtime_ns for p in shards] == written  # reused, not answered again
    assert torch.equal(read_token_counts(out), reloaded.token_counts)

    # a second run in the same folder must be asked to resume; resuming reuses data and continues
    with pytest.raises(ValueError, match="--resume"):
        distill(target, out, cfg, say=lines.append)
    stamps = [p.stat().st_mtime_ns for p in shards]
    cfg.train.steps = 18
    lines.clear()
    distill(target, out, cfg, resume=True, say=lines.append)
    assert any("resumed at step 12" in m for m in lines)
    assert [p.stat().st_mtime_ns for p in shards] == stamps
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [0, 6, 12, 18]

    # another run can add this run's teacher data to its own; the prompts answered there are neither asked
    # again nor held out
    more = DistillConfig(
        prompts=4,
        heldout_prompts=4,
        gen_batch=4,
        max_new_tokens=12,
        hidden=32,
        layers=1,
        extra_data=[out / "data"],
        self_prompts=2,
        train=TrainConfig(steps=1, batch_tokens=40, warmup=1),
    )
    lines.clear()
    distill(target, tmp_path / "more", more, say=lines.append)
    # the target was asked for its own prompts too (a random tiny target rarely finishes a turn: maybe none)
    written = json.loads((tmp_path / "more" / "self-prompts.json").read_text())["prompts"]
    assert len(written) <= 6 and any(
        m.startswith(f"self-written prompts: {len(written)} (of 6 asked: 2 to train on, 4 to hold out)") for m in lines
    )
    counts = [int(m.split()[2]) for m in lines if m.startswith("teacher data:")]
    assert counts and counts[0] > 4
    assert any(m.startswith("extra data:") and "(0 dropped" in m for m in lines)
    first = {tuple(r["prompt_ids"].tolist()) for r in load_rows(shards)}
    second = load_rows(sorted((tmp_path / "more").glob("*/shard-*.pt")))
    assert second and first.isdisjoint(tuple(r["prompt_ids"].tolist()) for r in second)
    more.extra_data = [tmp_path / "nothing-here"]
    with pytest.raises(ValueError, match="no teacher shards"):
        distill(target, tmp_path / "more2", more, say=lines.append)

    # a run can start from a saved draft: on the same held-out answers it starts where the first run ended
    warm = DistillConfig(
        prompts=8,
        heldout_prompts=4,
        gen_batch=4,
        max_new_tokens=12,
        init_from=out / "draft",
        train=TrainConfig(steps=1, batch_tokens=40, warmup=1),
    )
    lines.clear()
    distill(target, tmp_path / "warm", warm, say=lines.append)
    assert any(m.startswith("draft: 1 layers x 32 wide, MLP 96 (from ") for m in lines)
    warm_log = [json.loads(x) for x in (tmp_path / "warm" / "log.jsonl").read_text().splitlines()]
    assert warm_log[0]["step"] == 0
    assert warm_log[0]["eval_coarse_kl"] == pytest.approx(log[-1]["eval_coarse_kl"], rel=1e-4)
    # ... and can grow deeper and narrower on the way
    warm.layers, warm.intermediate = 2, 48
    distill(target, tmp_path / "grown", warm, say=lines.append)
    assert any(
        m.startswith("draft: 2 layers x 32 wide, MLP 48 (from ") and "reshaped from 1 layers" in m for m in lines
    )
    assert HFModel.from_pretrained(str(tmp_path / "grown" / "draft")).model.config.num_hidden_layers == 2
    warm.layers, warm.intermediate = None, 128  # wider than the saved MLP: refused before any generation
    with pytest.raises(ValueError, match="only adds layers and narrows"):
        distill(target, tmp_path / "wider", warm, say=lines.append)
    assert not (tmp_path / "wider" / "data").exists()
    warm.layers = warm.intermediate = None
    warm.init_from = tmp_path / "nothing-here"
    with pytest.raises(ValueError, match="no config.json"):
        distill(target, tmp_path / "warm2", warm, say=lines.append)


def test_evaluate_pair_on_itself_and_on_another_draft(tokenizer):
    target, other = _tiny_target(tokenizer, 0), _tiny_target(tokenizer, 1)
    prompts = ["Say something.", "Name a colour."]
    same = evaluate_pair(target, target, prompts, max_new_tokens=10, gammas=(1, 3))
    assert same["one_minus_tv"] == pytest.approx(1.0, abs=1e-6)
    assert same["greedy_agreement"] == 1.0
    # every draft accepted: blocks of gamma + 1 tokens (the last block may be shorter)
    assert same["expected_block_efficiency_t0"][3] > 3
    diff = evaluate_pair(target, other, prompts, max_new_tokens=10, gammas=(1, 3))
    assert diff["one_minus_tv"] < 0.9
    assert diff["expected_block_efficiency_t1"][3] < same["expected_block_efficiency_t1"][3]
    assert diff["step_cost_ratio"] > 0
    assert "by_category" not in diff

    # by category: the per-category measures are the overall ones split by prompt
    cats = evaluate_pair(target, other, prompts, max_new_tokens=10, gammas=(1,), categories=["chat", "colour"])
    assert set(cats["by_category"]) == {"chat", "colour"}
    parts = [cats["by_category"][c]["greedy_agreement"] for c in ("chat", "colour")]
    assert min(parts) <= cats["greedy_agreement"] <= max(parts)
    assert cats["greedy_agreement"] == pytest.approx(diff["greedy_agreement"])
    with pytest.raises(ValueError, match="categories"):
        evaluate_pair(target, other, prompts, categories=["chat"])


def test_mt_bench_prompts_in_file_order_or_spread(tmp_path):
    rows = [{"category": c, "turns": [f"{c} {i}?"]} for c in ("writing", "math") for i in range(3)]
    (tmp_path / "mt_bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert mt_bench_prompts(tmp_path)[:3] == ["writing 0?", "writing 1?", "writing 2?"]
    assert mt_bench_prompts(tmp_path, spread=True, with_categories=True)[:3] == [
        ("writing 0?", "writing"),
        ("math 0?", "math"),
        ("writing 1?", "writing"),
    ]
    with pytest.raises(ValueError, match="does not exist"):
        mt_bench_prompts(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["distill"], "--out"),
        (["distill", "--out", "{file}"], "is a file"),
        (["distill", "--out", "{dir}", "--steps", "0"], "--steps"),
        (["distill", "--out", "{dir}", "--on-policy", "-1"], "--on-policy must be >= 0"),
        (["distill", "--eval", "--eval-prompts", "0"], "--eval-prompts"),
    ],
)
def test_distill_cli_bad_input(argv, message, tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("x")
    argv = [a.format(file=f, dir=tmp_path / "d") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_time_budget_ends_training(tokenizer, tmp_path):
    target = _tiny_target(tokenizer)
    cfg = DistillConfig(
        prompts=4,
        heldout_prompts=2,
        gen_batch=4,
        max_new_tokens=8,
        hidden=16,
        layers=1,
        heads=2,
        kv_heads=1,
        init="embeddings",
        train=TrainConfig(
            steps=10**6, minutes=0.03, batch_tokens=16, warmup=1, eval_every=10**6, checkpoint_every=10**6
        ),
    )
    last = distill(target, tmp_path / "run", cfg, say=lambda m: None)
    assert 0 < last["step"] < 10**6 and 1.8 <= last["seconds"] < 10
    assert (tmp_path / "run" / "draft" / "model.safetensors").exists()


def test_contamination_keeps_mt_bench_wording_out_of_training(tokenizer, tmp_path):
    check = Contamination(["Compose an engaging travel blog post about a recent trip to Hawaii."])
    assert check("Please compose an engaging travel blog post about a recent trip to Kyoto!")
    assert not check("Write a blog post about a trip to Kyoto.")
    assert not check("What is the sum of the first ten integers?")  # short common phrases pass

    # the pool drops its prompts that copy an evaluation prompt's wording
    pool = prompt_pool(tmp_path)
    question = pool[0]
    (tmp_path / "mt_bench.jsonl").write_text(json.dumps({"turns": [question, "And again?"]}) + "\n")
    assert question not in prompt_pool(tmp_path) and len(prompt_pool(tmp_path)) < len(pool)

    # and an earlier run's answers to such a prompt are dropped from --extra-data
    target = _tiny_target(tokenizer)
    old = tmp_path / "old"
    old.mkdir()
    prompt_ids = torch.tensor(target.encode("Hi! " + question, chat=True), dtype=torch.int32)
    row = {
        "prompt_ids": prompt_ids,
        "ids": torch.tensor([5, 6, 7], dtype=torch.int32),
        "top_idx": torch.zeros(3, 64, dtype=torch.int32),
        "top_logp": torch.zeros(3, 64, dtype=torch.float16),
        "greedy": True,
    }
    clean = dict(row, prompt_ids=torch.tensor(target.encode("Name a colour.", chat=True), dtype=torch.int32))
    torch.save([row, clean], old / "shard-00000.pt")
    cfg = DistillConfig(
        prompts=4,
        heldout_prompts=4,
        gen_batch=4,
        max_new_tokens=8,
        hidden=32,
        layers=1,
        extra_data=[old],
        train=TrainConfig(steps=1, batch_tokens=40, warmup=1),
    )
    lines = []
    distill(target, tmp_path / "run", cfg, data_dir=tmp_path, say=lines.append)
    assert any(m.startswith("extra data: 1 answers from 1 shards (1 dropped") for m in lines)


def test_data_prompts_hand_over_records_the_answer_must_draw_on():
    import random
    import re

    from multispec.tools.distill.prompts import PLACES, _data_prompts

    prompts = _data_prompts(random.Random(3), 40)
    assert len(prompts) == 40
    for i, text in enumerate(prompts):
        task, _, records = text.partition("\n\n")
        rows = records.splitlines()
        kind = i % 4
        # 3-5 records (the CSV kind: 5-7 days under a header row)
        assert (5 <= len(rows) - 1 <= 7) if kind == 3 else (3 <= len(rows) <= 5), text
        if kind == 2 and "set in" in task:  # the place asked about is one of the works' settings
            asked = re.search(r"set in (.+?)\?", task).group(1)
            assert asked in PLACES and any(f"through {asked} " in r for r in rows), text
        if kind == 3:
            assert rows[0] == "date,units,revenue" and all(len(r.split(",")) == 3 for r in rows[1:])


def test_training_without_answers_stops_with_a_clear_error(tokenizer, tmp_path):
    from multispec.tools.distill.train import train

    draft = _tiny_target(tokenizer).model
    with pytest.raises(ValueError, match="no teacher answers to train on"):
        train(draft, tokenizer, [], [], [], tmp_path, TrainConfig(steps=1, warmup=1))
    assert not (tmp_path / "log.jsonl").exists()  # it stops before any evaluation or log


def test_training_steps_run_under_bfloat16_autocast_and_match_float32(tokenizer, tmp_path):
    from multispec.tools.distill.teacher import answer_batch
    from multispec.tools.distill.train import _forward

    target = _tiny_target(tokenizer)
    rows = answer_batch(target, ["Say something.", "Name a colour."], 10, greedy=False, seed=0)
    draft = build_draft(
        target.model, draft_config(target.model.config, hidden=32, layers=1, heads=2, kv_heads=1), init="embeddings"
    )
    full = _forward(draft, rows, 512, "float32")
    half = _forward(draft, rows, 512, "bfloat16")
    assert full[0].dtype == torch.float32 and half[0].dtype == torch.bfloat16
    loss_full, loss_half = coarse_kl(*full).mean(), coarse_kl(*half).mean()
    assert loss_half.item() == pytest.approx(loss_full.item(), rel=0.02)
    loss_half.backward()  # gradients reach the float32 weights
    assert draft.lm_head.weight.grad is not None and draft.lm_head.weight.grad.dtype == torch.float32
    with pytest.raises(ValueError, match="training dtype"):
        train(draft, None, rows, rows, [], tmp_path, TrainConfig(dtype="int8"))


def test_teacher_rows_hold_the_targets_own_answers_and_its_distributions_along_them(tokenizer):
    import multispec
    from multispec.tools.distill.teacher import TOP_K, answer_batch

    target = _tiny_target(tokenizer)
    prompts = ["Hi.", "Name three colours of the rainbow, please.", "Why?"]  # of different lengths
    rows = answer_batch(target, prompts, max_new_tokens=6, greedy=True, seed=0)
    assert len(rows) == 3 and all(r["source"] == "target" and r["greedy"] for r in rows)
    with torch.no_grad():
        for text, r in zip(prompts, rows, strict=True):
            p = target.encode(text, chat=True)
            assert r["prompt_ids"].tolist() == p
            # the answer is the target's greedy continuation, token by token without a cache ...
            seq = list(p)
            for _ in range(len(r["ids"])):
                seq.append(int(target.model(torch.tensor([seq])).logits[0, -1].argmax()))
            assert r["ids"].tolist() == seq[len(p) :]
            # ... and the stored distributions are the target's at each answer position
            logits = target.model(torch.tensor([seq])).logits[0, len(p) - 1 : -1]
            top = torch.log_softmax(logits, -1).topk(TOP_K, -1)
            assert torch.equal(r["top_idx"].long(), top.indices)
            assert torch.allclose(r["top_logp"].float(), top.values, atol=2e-2)
    # sampled: prompt i is seeded seed + i, as `multispec.generate` seeds it
    sampled = answer_batch(target, prompts, max_new_tokens=6, greedy=False, seed=5)
    alone = multispec.generate(target, None, prompts[1], "ar", max_new_tokens=6, temperature=1.0, seed=6)
    assert sampled[1]["ids"].tolist() == alone.token_ids and not sampled[1]["greedy"]


def test_on_policy_rows_hold_the_drafts_answers_and_the_targets_distributions_along_them(tokenizer, tmp_path):
    from multispec.tools.distill.teacher import TOP_K, build_on_policy, draft_answer_batch

    target = _tiny_target(tokenizer)
    draft = _tiny_target(tokenizer, seed=1).model
    # prompts of different lengths, so that padding mistakes (positions, masks) change the scores
    prompts = [target.encode(p, chat=True) for p in ["Hi.", "Name three colours of the rainbow, please.", "Why?"]]
    rows = draft_answer_batch(draft, target, prompts, max_new_tokens=6, greedy=True, seed=0)
    assert len(rows) == 3 and all(r["source"] == "draft" and r["greedy"] for r in rows)
    with torch.no_grad():
        for p, r in zip(prompts, rows, strict=True):
            # the answer is the draft's own greedy continuation, token by token without a cache ...
            seq = list(p)
            for _ in range(len(r["ids"])):
                seq.append(int(draft(torch.tensor([seq])).logits[0, -1].argmax()))
            assert r["ids"].tolist() == seq[len(p) :]
            # ... and the stored distributions are the target's at each answer position, computed alone
            logits = target.model(torch.tensor([seq])).logits[0, len(p) - 1 : -1]
            top = torch.log_softmax(logits, -1).topk(TOP_K, -1)
            assert torch.equal(r["top_idx"].long(), top.indices)
            assert torch.allclose(r["top_logp"].float(), top.values, atol=2e-2)

    # sampled answers differ with the seed; shards already written are kept on a rerun
    folder = tmp_path / "on-policy"
    paths = build_on_policy(draft, target, prompts * 2, folder, batch_size=3, max_new_tokens=6, seed=0)
    assert [p.name for p in paths] == ["shard-00000.pt", "shard-00001.pt"]
    sampled = load_rows(paths[1:])
    assert not any(r["greedy"] for r in sampled)
    stamps = [p.stat().st_mtime_ns for p in paths]
    build_on_policy(draft, target, prompts * 2, folder, batch_size=3, max_new_tokens=6, seed=0)
    assert [p.stat().st_mtime_ns for p in paths] == stamps

    # in a run: the starting draft answers some training prompts and those rows are trained on too
    cfg = DistillConfig(
        prompts=4,
        heldout_prompts=2,
        gen_batch=4,
        max_new_tokens=8,
        hidden=32,
        layers=1,
        heads=2,
        kv_heads=1,
        init="embeddings",
        on_policy=3,
        train=TrainConfig(steps=1, batch_tokens=40, warmup=1),
    )
    lines = []
    distill(target, tmp_path / "run", cfg, say=lines.append)
    said = [m for m in lines if m.startswith("on-policy data:")]
    assert said and said[0].startswith("on-policy data: the draft answered 3 training prompts")
    teacher_prompts = {
        tuple(r["prompt_ids"].tolist()) for r in load_rows(sorted((tmp_path / "run" / "data").glob("*.pt")))
    }
    drafted = load_rows(sorted((tmp_path / "run" / "on-policy").glob("*.pt")))
    assert drafted and all(tuple(r["prompt_ids"].tolist()) in teacher_prompts for r in drafted)
