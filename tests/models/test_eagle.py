"""Feature-level draft heads (`multispec.models.eagle`) and the target that keeps its features
(`multispec.models.features`): the law stays the target's, greedy stays `ar`'s, the head reads the target's features
of exactly the committed tokens, and heads in the speculators layout load."""

import json

import pytest
import torch
from safetensors.torch import save_file

from multispec import generate
from multispec.models.eagle import EagleDraft, is_eagle, load_eagle, new_head, save_eagle
from multispec.models.features import FeatureTarget
from multispec.tools.check import check_method
from tests.conftest import tiny_llama
from tests.wrong_rules import target_over_draft_vocab_verify

RUNS = 2000


@pytest.mark.parametrize(
    "method, params",
    [
        ("sd", {"gamma": 2}),
        pytest.param("mcsd", {"k_config": "2x1"}, marks=pytest.mark.slow),
        pytest.param("sd", {"gamma": "auto"}, marks=pytest.mark.slow),
    ],
)
def test_a_head_reading_the_targets_features_keeps_the_target_law(method, params):
    # the head's vocabulary leaves one of the four tokens out: the residual must supply it
    report = check_method(method, runs=RUNS, pairs=1, vocab=4, n_tokens=4, seed=2, models="features", **params)
    assert report.passed, report.pairs


def test_a_head_cut_further_by_draft_vocab_keeps_the_target_law():
    report = check_method(
        "sd", runs=RUNS, pairs=1, vocab=4, n_tokens=4, seed=2, models="features", gamma=2, draft_vocab=2
    )
    assert report.passed, report.pairs


def test_renormalising_the_target_over_the_heads_vocabulary_fails_the_same_check(monkeypatch):
    import multispec.decoding.sd

    monkeypatch.setattr(multispec.decoding.sd, "speculative_verify", target_over_draft_vocab_verify)
    report = check_method("sd", runs=RUNS, pairs=1, vocab=4, n_tokens=4, seed=2, models="features", gamma=2)
    assert not report.passed


class Recording(EagleDraft):
    """A head that keeps the caches it made, to look into after a generation."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.caches = []

    def new_cache(self):
        cache = super().new_cache()
        self.caches.append(cache)
        return cache


@pytest.fixture(scope="module")
def target():
    return tiny_llama(layers=4, seed=3)


@pytest.mark.parametrize("method", ["sd:gamma=3", "mcsd:k_config=2x2", "specinfer:k_config=2x2"])
def test_the_head_reads_the_targets_features_of_exactly_the_committed_tokens(target, method):
    head = new_head(target, seed=4)
    draft = Recording(head, target)
    prompt = [5, 17, 3, 42, 8]
    out = generate(target, draft, prompt, method=method, max_new_tokens=24, temperature=1.0, seed=7)
    assert out.stats.drafted > 0
    tokens = prompt + out.token_ids
    cache = draft.caches[-1]
    held = cache.length
    assert held >= len(tokens) - 8  # every committed token but the last iterations' is held
    # one forward of the target over the whole text gives every position's features; the head's entries, fed one
    # iteration at a time, must be those it makes from them in one pass
    wrapped = FeatureTarget(target, head.cfg.target_layers)
    whole = wrapped.new_cache()
    wrapped.forward(whole, torch.tensor([tokens]))
    reference = draft.new_cache()
    draft.attach(reference, whole)
    draft.forward(reference, torch.tensor([tokens[:held]]))
    assert reference.length == held  # (entries past a cache's length are free: stale drafts, or nothing)
    assert torch.allclose(cache.keys[:, :, :held], reference.keys[:, :, :held], atol=1e-4)
    assert torch.allclose(cache.out[:, :held], reference.out[:, :held], atol=1e-4)


def test_draft_vocab_cuts_a_heads_output_rows(target):
    draft = EagleDraft(new_head(target, draft_ids=torch.arange(0, 64, 2), seed=5), target)
    cut = draft.with_head_rows(torch.tensor([4, 5, 6, 60]))
    assert cut.head.lm_head.weight.shape[0] == 3 and cut.head.layer is draft.head.layer  # 5 is not in its vocabulary
    cache = draft.new_cache()
    whole = draft.forward(cache, torch.tensor([[1, 2, 3]]))
    part = cut.forward(cut.new_cache(), torch.tensor([[1, 2, 3]]))
    assert torch.allclose(part[..., [0, 2, 3]], whole[..., [4, 6, 60]], atol=1e-5)
    assert torch.isinf(part[..., 1]).all()
    prompt = [1, 5, 9, 3]
    ar = generate(target, None, prompt, method="ar", max_new_tokens=20, temperature=0)
    draft.token_counts = torch.arange(64)  # ranks the ids by value: 8 keeps 56..63, of which its vocabulary has 4
    out = generate(target, draft, prompt, method="sd:gamma=3,draft_vocab=8", max_new_tokens=20, temperature=0)
    assert out.token_ids == ar.token_ids


@pytest.mark.parametrize("method", ["sd:gamma=3", "mcsd:k_config=2x2", "sd:gamma=auto,drafter=hybrid", "bild", "mtad"])
def test_greedy_with_a_head_is_greedy_ar(target, method):
    draft = EagleDraft(new_head(target, draft_ids=torch.arange(0, 64, 2), seed=5), target)
    prompt = [1, 5, 9, 3]
    ar = generate(target, None, prompt, method="ar", max_new_tokens=20, temperature=0)
    assert generate(target, draft, prompt, method=method, max_new_tokens=20, temperature=0).token_ids == ar.token_ids


@pytest.mark.parametrize("method, temperature", [("sd:gamma=2", 0.0), ("sd:gamma=2", 1.0), ("mcsd:k_config=2x2", 1.0)])
def test_rows_with_a_head_get_their_own_tokens_while_the_targets_steps_are_batched(target, method, temperature):
    from multispec.batching import Batcher
    from tests.test_batching import PROMPTS, _alone, _run

    draft = EagleDraft(new_head(target, seed=6), target)
    want = _alone((target, draft), method, temperature)
    batcher = Batcher(target, draft, rows=len(PROMPTS), capacity=256)
    try:
        assert _run(batcher, PROMPTS, method, temperature, stagger=0.02) == want
        # the target's steps ran batched, and gave the heads their rows' features
        assert batcher.stats["forwards"] > 0 and batcher.stats["rows"] > batcher.stats["forwards"]
    finally:
        batcher.close()


def test_a_head_keeps_the_target_law_in_a_batch():
    report = check_method("sd", runs=600, pairs=1, vocab=4, n_tokens=4, seed=2, models="features", batch=6, gamma=2)
    assert report.passed, report.pairs


def test_gamma_auto_prices_a_heads_rows_in_a_batch(target):
    from multispec.batching import Batcher
    from tests.test_batching import PROMPTS, _run

    draft = EagleDraft(new_head(target, seed=6), target)
    batcher = Batcher(target, draft, rows=3, capacity=256)
    try:
        got = _run(batcher, PROMPTS[:3], "sd:gamma=auto", 0.0)
    finally:
        batcher.close()
    ar = [generate(target, None, p, "ar", max_new_tokens=12, temperature=0, score=False).token_ids for p in PROMPTS[:3]]
    assert got == ar


def test_a_heads_linear_maps_run_on_packed_weights_where_they_won_here(target, tmp_path, monkeypatch):
    # the head's products, as the target's eager steps', on weights packed once where that ran faster here
    # (`linears.pack`): here forced to win, the head gives the logits its plain weights give
    from multispec.models import linears

    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))  # a kernel store of its own
    monkeypatch.setattr(linears, "_CHOICES", {})
    monkeypatch.setattr(linears, "_TILES", {})
    monkeypatch.setattr(linears, "GAIN", 1e9)  # packed wins whatever the timings
    packed, plain = (EagleDraft(new_head(target, seed=6), target) for _ in range(2))
    plain.packed_linears = False
    tokens = torch.tensor([[1, 2, 3, 4]])
    got = packed.forward(packed.new_cache(), tokens)
    assert packed.packed_linears is True
    assert all(linears.packed_kind(m) is not None for m in linears._linears(packed.head))
    want = plain.forward(plain.new_cache(), tokens)
    assert torch.allclose(got, want, atol=1e-4) and not torch.isinf(want).all()


def _speculators_head(folder, target, midlayer=False, embed=False, seed=0):
    """A tiny random head written by hand in the speculators layout (names and config as vLLM reads them), not
    through `save_eagle`."""
    g = torch.Generator().manual_seed(seed)
    cfg = target.model.config
    h, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd, inter, vocab, draft_vocab = h // heads, 48, cfg.vocab_size, 32
    layer = "midlayer" if midlayer else "layers.0"
    selected = torch.arange(0, 64, 2)  # draft id d is target id 2d
    weights = {
        "fc.weight": torch.randn(h, 3 * h, generator=g) * 0.1,
        f"{layer}.self_attn.q_proj.weight": torch.randn(heads * hd, 2 * h, generator=g) * 0.1,
        f"{layer}.self_attn.k_proj.weight": torch.randn(kv * hd, 2 * h, generator=g) * 0.1,
        f"{layer}.self_attn.v_proj.weight": torch.randn(kv * hd, 2 * h, generator=g) * 0.1,
        f"{layer}.self_attn.o_proj.weight": torch.randn(h, heads * hd, generator=g) * 0.1,
        f"{layer}.mlp.gate_proj.weight": torch.randn(inter, h, generator=g) * 0.1,
        f"{layer}.mlp.up_proj.weight": torch.randn(inter, h, generator=g) * 0.1,
        f"{layer}.mlp.down_proj.weight": torch.randn(h, inter, generator=g) * 0.1,
        f"{layer}.input_layernorm.weight": torch.ones(h),
        f"{layer}.hidden_norm.weight": torch.ones(h),
        f"{layer}.post_attention_layernorm.weight": torch.ones(h),
        "norm.weight": torch.ones(h),
        "lm_head.weight": torch.randn(draft_vocab, h, generator=g),
        "d2t": selected - torch.arange(draft_vocab),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, selected, True),
    }
    if embed:
        weights["embed_tokens.weight"] = torch.randn(vocab, h, generator=g)
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": {
            "model_type": "llama",
            "vocab_size": vocab,
            "hidden_size": h,
            "intermediate_size": inter,
            "num_hidden_layers": 1,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "max_position_embeddings": 128,
        },
        "draft_vocab_size": draft_vocab,
        "norm_before_residual": False,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("midlayer, embed", [(False, False), (True, True)])
def test_a_speculators_head_loads_and_every_method_runs_on_it(target, tmp_path, midlayer, embed):
    folder = _speculators_head(tmp_path / "head", target, midlayer=midlayer, embed=embed)
    assert is_eagle(folder) and not is_eagle(tmp_path)
    draft = load_eagle(folder, target)
    assert draft.feature_layers == (2, 2, 1)  # EAGLE-3's low, middle and high layers of a 4-layer target
    assert sorted(draft.ids.tolist()) == list(range(0, 64, 2))
    assert draft.head.shared_embed if not embed else not draft.head.shared_embed
    prompt = [1, 5, 9, 3]
    ar = generate(target, None, prompt, method="ar", max_new_tokens=16, temperature=0)
    for method in ("sd:gamma=3", "specinfer:k_config=2x2", "mjsd", "batch-sd"):
        assert generate(target, draft, prompt, method=method, max_new_tokens=16, temperature=0).token_ids == (
            ar.token_ids
        ), method
    sampled = generate(target, draft, prompt, method="dsbd", max_new_tokens=16, temperature=1.0, seed=1)
    assert len(sampled.token_ids) == 16
    # written back and read again: the same drafts
    again = load_eagle(save_eagle(draft.head, tmp_path / "again"), target)
    a = generate(target, draft, prompt, method="sd:gamma=3", max_new_tokens=16, temperature=1.0, seed=2)
    b = generate(target, again, prompt, method="sd:gamma=3", max_new_tokens=16, temperature=1.0, seed=2)
    assert a.token_ids == b.token_ids


def test_heads_that_do_not_fit_are_refused_clearly(target, tmp_path):
    folder = _speculators_head(tmp_path / "head", target)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [1, 2, 9]}))
    with pytest.raises(ValueError, match=r"reads layers \[1, 2, 9\]; .* has 4 layers"):
        load_eagle(folder, target)
    other = tiny_llama(hidden=64, layers=4)
    with pytest.raises(ValueError, match="reads hidden states of width 32"):
        load_eagle(_speculators_head(tmp_path / "narrow", target), other)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    with pytest.raises(ValueError, match="no .safetensors weights"):
        load_eagle(tmp_path / "empty", target)
    with pytest.raises(ValueError, match="not 'eagle3'"):
        (tmp_path / "empty" / "config.json").write_text(json.dumps({"speculators_model_type": "mlp"}))
        load_eagle(tmp_path / "empty", target)


def test_the_feature_cache_follows_every_cache_operation(target):
    wrapped = FeatureTarget(target, (0, 2))
    cache = wrapped.new_cache()
    tokens = torch.tensor([[4, 8, 15, 16, 23, 42]])
    wrapped.forward(cache, tokens)
    full = cache.features.clone()
    assert full.shape == (1, 6, 2 * 32)
    wrapped.keep_positions(cache, torch.tensor([0, 1, 3]))
    assert torch.equal(cache.features, full[:, [0, 1, 3]])
    wrapped.crop(cache, 2)
    assert torch.equal(cache.features, full[:, :2])
    wrapped.select_rows(cache, torch.tensor([0, 0]))
    assert cache.features.shape == (2, 2, 64)
    with pytest.raises(ValueError, match="does not expose its hidden states"):
        FeatureTarget(EagleDraft(new_head(target), target), (0,))


def test_the_heads_cache_follows_every_cache_operation(target):
    # the head's entries sit in buffers past which its cache grows (`EagleCache`); the engine's cache operations,
    # made outside inference mode as a commit makes them, keep exactly the entries they name, in that order
    draft = EagleDraft(new_head(target, seed=8), target)
    cache = draft.new_cache()
    draft.forward(cache, torch.tensor([[4, 8, 15, 16, 23, 42]]))
    keys, out, positions = cache.keys[:, :, :6].clone(), cache.out[:, :6].clone(), cache.positions[:, :6].clone()
    assert cache.length == 6 and torch.equal(positions, torch.arange(6)[None])
    draft.keep_positions(cache, torch.tensor([0, 1, 3]))
    assert cache.length == 3 and torch.equal(cache.keys[:, :, :3], keys[:, :, [0, 1, 3]])
    assert torch.equal(cache.out[:, :3], out[:, [0, 1, 3]]) and cache.positions[0, :3].tolist() == [0, 1, 3]
    draft.crop(cache, 2)
    draft.select_rows(cache, torch.tensor([0, 0]))
    assert cache.rows == 2 and cache.length == 2 and torch.equal(cache.out[1, :2], out[0, :2])
    draft.keep_positions(cache, torch.tensor([[1], [0]]))  # a position per row
    assert torch.equal(cache.out[:, :1], torch.stack([out[:, 1], out[:, 0]]))
    logits = draft.forward(cache, torch.tensor([[7], [7]]), positions=torch.tensor([[2], [1]]))
    assert cache.length == 2 and logits.shape[:2] == (2, 1) and torch.isfinite(logits).any()


@pytest.mark.slow  # compiles
def test_a_compiled_target_returns_the_features_its_eager_steps_give(tmp_path, monkeypatch):
    # packaged compiled steps return the read layers' inputs beside the logits (no eager step, no second forward):
    # every fed token's features are the eager hooks', and greedy with a head on the compiled target stays ar's
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    eager, compiled = tiny_llama(layers=4, seed=3), tiny_llama(layers=4, seed=3)
    compiled.compile, compiled.steps.kernel = True, "onednn"  # one variant: one package per shape
    layers = (0, 2, 3)
    want, got = FeatureTarget(eager, layers), FeatureTarget(compiled, layers)
    cw, cg = want.new_cache(), got.new_cache()
    for tokens in ([5, 17, 3, 42, 8], [9], [4, 33, 2], [7]):
        expected = want.forward(cw, torch.tensor([tokens]))
        assert torch.allclose(got.forward(cg, torch.tensor([tokens])), expected, atol=1e-4)
    assert cg.features.shape == cw.features.shape == (1, 10, 3 * 32)
    assert torch.allclose(cg.features, cw.features, atol=1e-4)
    # the prompt ran eagerly; the steps of 1 and 3 tokens (buckets 1 and 4) in packages that return the features
    assert compiled.compiles == 2 and not compiled.fallbacks
    assert {stored for stored, _ in compiled.steps._packages} == {"onednn+features-0-2-3"}
    # a head reading the same layers runs on the packages made above (gamma=3: the buckets of 1 and 4 tokens)
    draft = EagleDraft(new_head(compiled, draft_ids=torch.arange(0, 64, 2), target_layers=layers, seed=5), compiled)
    prompt = [1, 5, 9, 3]
    ar = generate(eager, None, prompt, method="ar", max_new_tokens=16, temperature=0)
    out = generate(compiled, draft, prompt, method="sd:gamma=3", max_new_tokens=16, temperature=0)
    assert out.token_ids == ar.token_ids and not compiled.fallbacks


@pytest.mark.slow  # compiles
def test_a_batch_invariant_target_returns_the_features_of_a_prompt_fed_with_drafts(tmp_path, monkeypatch):
    # batch-invariant compiled steps score a first feed of a prompt and drafts in two parts (the prompt eagerly, the
    # drafts in a compiled step): both parts' features come back, in order, as one eager step gives them
    from multispec.models import hf

    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    eager, compiled = tiny_llama(layers=4, seed=3), tiny_llama(layers=4, seed=3)
    compiled.compile, compiled.steps.kernel = True, hf.INVARIANT
    layers = (0, 2, 3)
    want, got = FeatureTarget(eager, layers), FeatureTarget(compiled, layers)
    cw, cg = want.new_cache(), got.new_cache()
    tokens = torch.tensor([[5, 17, 3, 42, 8, 9]])  # a prompt of 4, then 2 drafts
    expected = want.forward(cw, tokens, fused_prefix=3)
    assert torch.allclose(got.forward(cg, tokens, fused_prefix=3), expected, atol=1e-4)
    assert cg.features.shape == cw.features.shape == (1, 6, 3 * 32)
    assert torch.allclose(cg.features, cw.features, atol=1e-4)
    assert any(stored.endswith("+features-0-2-3") for stored, _ in compiled.steps._packages)


def dpbf16_unavailable() -> bool:
    from multispec.models import dpbf16

    return dpbf16.unavailable() is not None


def _lean_and_eager_logits(target, lean, eager, monkeypatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of two heads over one history: a prompt fed with the target's features, then three drafts on their
    own features, the last two dropped and the first fed again with the target's (as a drafter does)."""
    from multispec.models.features import FeatureTarget

    ids = torch.randint(256, (1, 16), generator=torch.Generator().manual_seed(2))
    wrapped = FeatureTarget(target, lean.feature_layers)
    scored = wrapped.new_cache()
    wrapped.forward(scored, ids[:, :12])
    out = []
    for draft in (lean, eager):
        cache = draft.new_cache()
        draft.attach(cache, scored)
        logits = [draft.forward(cache, ids[:, :12])]
        logits += [draft.forward(cache, ids[:, 12 + i : 13 + i]) for i in range(3)]
        draft.crop(cache, 12)
        logits.append(draft.forward(cache, ids[:, 12:13]))
        out.append(torch.cat([x[0, :, draft.column_index].float() for x in logits]))
    return out[0], out[1]


@pytest.mark.skipif(dpbf16_unavailable(), reason="our kernel does not run here (AVX512-BF16)")
def test_a_bfloat16_head_runs_its_layer_in_one_kernel_call_close_to_its_eager_layer(tmp_path, monkeypatch):
    # where every map of a bfloat16 head's layer runs on our kernels (forced to win here, on the AMX tiles where
    # they run, else the dot products), its layer is one C++ call (`LeanHead`): its logits are the eager layer's
    # within bfloat16 rounding, over prompts, drafts on its own features and a cropped cache; one known-wrong
    # layer (the raw feature as the residual instead of the normed one) is far off; greedy with it stays `ar`'s
    from multispec.models import dpbf16, linears
    from multispec.models.eagle import LeanHead
    from tests.models.helpers import _bf16_llama

    if not dpbf16.tiles_run():
        monkeypatch.setenv(dpbf16.TILES_VARIABLE, "0")
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    monkeypatch.setattr(linears, "_CHOICES", {})
    monkeypatch.setattr(linears, "_TILES", {})
    monkeypatch.setattr(linears, "GAIN", float("inf"))
    target = _bf16_llama()
    head = new_head(target, draft_ids=torch.arange(0, 256, 2), seed=2)
    head.layer.hidden_norm.weight.data.uniform_(0.5, 1.5)  # (a residual of the raw feature must show)
    lean, eager = EagleDraft(head, target), EagleDraft(head, target)
    eager._lean_head = "turned off"
    got, want = _lean_and_eager_logits(target, lean, eager, monkeypatch)
    assert isinstance(lean._lean_head, LeanHead), lean._lean_head
    close = float((got - want).abs().mean())
    assert close < 0.02 * float(want.abs().mean()), close
    with monkeypatch.context() as wrong_layer:
        wrong_layer.setattr(LeanHead, "__init__", _wrong_residual(LeanHead.__init__))
        got, _ = _lean_and_eager_logits(target, EagleDraft(head, target), eager, monkeypatch)
    assert float((got - want).abs().mean()) > 10 * close
    prompt = [5, 17, 3, 42, 8]
    ar = generate(target, None, prompt, method="ar", max_new_tokens=16, temperature=0)
    out = generate(target, lean, prompt, method="sd:gamma=3", max_new_tokens=16, temperature=0)
    assert out.token_ids == ar.token_ids


def _wrong_residual(init):
    def wrong(self, head):
        init(self, head)
        self.normed_residual = not self.normed_residual

    return wrong
