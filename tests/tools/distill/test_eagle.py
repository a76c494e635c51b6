"""`multispec distill --kind eagle`: a feature-level head trained on a tiny random target."""

import json

import pytest
import torch

from multispec import generate
from multispec.models.eagle import load_eagle
from multispec.tools.distill import DistillConfig, TrainConfig, distill
from multispec.tools.distill.eagle import head_forward, target_features
from tests.tools.distill.test_distill import _tiny_target, tokenizer  # noqa: F401 - the fixture


@pytest.mark.slow
def test_a_head_trains_on_the_targets_features_resumes_and_drafts_exactly(tokenizer, tmp_path):  # noqa: F811
    target = _tiny_target(tokenizer)
    cfg = DistillConfig(
        prompts=8,
        heldout_prompts=4,
        gen_batch=4,
        max_new_tokens=12,
        kind="eagle",
        draft_vocab=2000,
        train=TrainConfig(steps=12, batch_tokens=40, lr=1e-2, warmup=2, eval_every=6, checkpoint_every=6),
    )
    out = tmp_path / "run"
    lines = []
    last = distill(target, out, cfg, say=lines.append)
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [0, 6, 12]
    assert log[-1]["eval_coarse_kl"] < log[0]["eval_coarse_kl"]  # it learns the target
    assert last["step"] == 12
    assert any("draft vocabulary 2000" in line for line in lines)
    # the features are kept beside the shards, and the head is saved in the speculators layout
    assert len(list((out / "features" / "data").glob("shard-*.pt"))) == 2
    config = json.loads((out / "eagle" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 2000
    head = load_eagle(out / "eagle", target)
    prompt = target.encode("Write a short poem about the sea.")
    ar = generate(target, None, prompt, method="ar", max_new_tokens=16, temperature=0)
    for method in ("sd:gamma=3", "mcsd:k_config=2x2", "sd:gamma=auto,drafter=hybrid"):
        out_tokens = generate(target, head, prompt, method=method, max_new_tokens=16, temperature=0).token_ids
        assert out_tokens == ar.token_ids, method
    # a resumed run continues from the checkpoint
    more = DistillConfig(**{**cfg.__dict__, "train": TrainConfig(**{**cfg.train.__dict__, "steps": 18})})
    distill(target, out, more, resume=True, say=lines.append)
    assert json.loads((out / "log.jsonl").read_text().splitlines()[-1])["step"] == 18


def test_the_second_pass_reads_the_heads_own_features_and_sees_no_later_entry(tokenizer):  # noqa: F811
    from multispec.models.eagle import new_head

    target = _tiny_target(tokenizer)
    ids = target.encode("Name three colours.")
    row = {
        "prompt_ids": torch.tensor(ids[:-3], dtype=torch.int32),
        "ids": torch.tensor(ids[-3:], dtype=torch.int32),
        "top_idx": torch.zeros(3, 4, dtype=torch.int32),
        "top_logp": torch.full((3, 4), -2.0, dtype=torch.float16),
    }
    head = new_head(target, torch.arange(100), seed=1).float()
    row["features"] = target_features(target, [row], head.cfg.target_layers, 512)[0]
    to_draft = torch.full((target.vocab_size,), -1, dtype=torch.long)
    to_draft[:100] = torch.arange(100)
    logits, top, _ = head_forward(head, to_draft, [row], 512, unroll=2)
    assert logits.shape == (6, 100) and top.shape == (6, 4)
    # pass 2 at the last answer position equals drafting it: the committed entries before it (with the target's
    # features), then the head's own output at the position before, fed to the head as a draft's second token is
    from multispec.models.eagle import EagleDraft
    from multispec.models.features import FeatureCache

    draft = EagleDraft(head, target)
    seq = torch.tensor(ids).long()
    n = len(seq)
    cache = draft.new_cache()
    draft.attach(cache, FeatureCache(None, row["features"][None, : n - 3].float()))
    first = draft.forward(cache, seq[None, : n - 2])  # entries 0 .. n - 3, on the target's features
    second = draft.forward(cache, seq[None, n - 2 : n - 1])  # entry n - 2 reads the head's output at n - 3
    assert torch.allclose(first[0, -1, :100], logits[1], atol=1e-4)
    assert torch.allclose(second[0, -1, :100], logits[5], atol=1e-4)
    # and not what it would read with the target's feature there
    assert not torch.allclose(second[0, -1, :100], logits[2], atol=1e-2)
