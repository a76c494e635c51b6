"""The Hugging Face backend (`multispec.models.hf`) on tiny random Llamas: tree forwards, greedy equivalence,
compiled steps and their kernels, batch invariance, fallbacks."""

import pytest
import torch

from multispec import generate
from multispec.engine import Entries, ModelRunner
from multispec.models import hf, packaged, static
from multispec.trees import TokenTree
from tests.conftest import tiny_llama
from tests.models.helpers import PROMPT, _bf16_llama, _scored_after_a_prompt, full_logits


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    # compiled steps are kept on disk beside the cost file: each test has its own folder, so that none loads a
    # step another test compiled
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))


@pytest.mark.parametrize("parents", [[-1, -1, 0, 0, 1, 1], [-1, 0, -1, 2, 1, 3, 3], [-1, 0, 1, 2]])
def test_tree_masked_forward_equals_each_path(parents):
    model = tiny_llama()
    tree = TokenTree.from_parents(parents)
    tokens = torch.randint(0, 64, (tree.size,), generator=torch.Generator().manual_seed(len(parents)))
    runner = ModelRunner(model)
    committed = list(PROMPT)
    runner.feed([committed[:-1]])  # a cache already holding part of the committed sequence
    logits = runner.feed([committed], Entries.tree(tree, tokens))[0]
    assert logits.shape == (1 + tree.size, 64)
    assert torch.allclose(logits[0], full_logits(model, committed)[-1], atol=1e-4)
    for g in range(tree.size):
        path = committed + tokens[tree.path(g)].tolist()
        ref = full_logits(model, path)[-1]
        assert torch.allclose(logits[1 + g], ref, atol=1e-4), (g, (logits[1 + g] - ref).abs().max())


def test_tree_fed_level_by_level_equals_paths():
    # how a draft builds a tree: one forward per depth, earlier levels already cached as tentative entries
    model = tiny_llama(seed=1)
    tree = TokenTree.from_parents([-1, -1, 0, 0, 1, 1, 2, 5])
    tokens = torch.arange(10, 10 + tree.size)
    runner = ModelRunner(model)
    first = runner.feed([PROMPT], Entries.tree(tree, tokens[:2], slice(0, 2)))[0]
    second = runner.feed([PROMPT], Entries.tree(tree, tokens[2:6], slice(2, 6)))[0]
    third = runner.feed([PROMPT], Entries.tree(tree, tokens[6:], slice(6, 8)))[0]
    rows = torch.cat([first[1:], second, third])
    for g in range(tree.size):
        ref = full_logits(model, PROMPT + tokens[tree.path(g)].tolist())[-1]
        assert torch.allclose(rows[g], ref, atol=1e-4)


def test_deterministic_beam_search_matches_a_cacheless_reference():
    model = tiny_llama(seed=4)
    width, steps = 3, 5
    beams = [([], 0.0)]
    for _ in range(steps):
        cands = []
        for seq, score in beams:
            logp = torch.log_softmax(full_logits(model, PROMPT + seq)[-1], -1)
            cands += [(seq + [v], score + float(logp[v])) for v in range(64)]
        beams = sorted(cands, key=lambda c: -c[1])[:width]
    r = generate(model, None, PROMPT, method="beam", width=width, deterministic=True, max_new_tokens=steps)
    assert r.token_ids == beams[0][0]
    assert r.stats["target_calls"] == steps


@pytest.mark.parametrize("gamma, confidence", [(1, 0.0), (3, 0.0), (6, 0.0), (6, 0.07)])
def test_greedy_sd_equals_greedy_ar_on_tiny_llamas(gamma, confidence):
    target, draft = tiny_llama(seed=5), tiny_llama(seed=6, layers=1)
    ar = generate(target, None, PROMPT, method="ar", temperature=0, max_new_tokens=40)
    sd = generate(
        target, draft, PROMPT, method="sd", gamma=gamma, confidence=confidence, temperature=0, max_new_tokens=40
    )
    assert sd.token_ids == ar.token_ids
    assert sd.stats["target_calls"] == sd.stats["iterations"]  # one target forward per iteration
    if confidence:  # the threshold must end some chains early and let others run on
        plain = generate(target, draft, PROMPT, method="sd", gamma=gamma, temperature=0, max_new_tokens=40)
        assert sd.stats["iterations"] < sd.stats["drafted"] < plain.stats["drafted"] // 2


def test_different_vocabularies_are_refused_naming_both_sizes():
    target, draft = tiny_llama(vocab=64), tiny_llama(vocab=80)
    with pytest.raises(ValueError, match=r"64.*80"):
        generate(target, draft, PROMPT, method="sd")


@pytest.mark.parametrize("drafts, gamma", [(2, 3), (4, 2)])
def test_greedy_batch_sd_on_tiny_llamas_equals_greedy_ar(drafts, gamma):
    target, draft = tiny_llama(seed=5), tiny_llama(seed=6, layers=1)
    ar = generate(target, None, PROMPT, method="ar", temperature=0, max_new_tokens=30)
    r = generate(target, draft, PROMPT, method="batch-sd", drafts=drafts, gamma=gamma, temperature=0, max_new_tokens=30)
    assert r.token_ids == ar.token_ids


def test_sampled_batch_sd_uses_tree_masks_consistently():
    # with the target as its own draft, the draft's level-by-level tree forwards must give the same
    # distributions as the target's single tree forward: then nothing is ever rejected
    target = tiny_llama(seed=7)
    r = generate(target, target, PROMPT, method="batch-sd", drafts=3, gamma=4, max_new_tokens=40, seed=1)
    assert r.stats["rejections"] == 0 and r.stats["target_calls"] == 8


@pytest.mark.slow
def test_compiled_forward_equals_eager_and_counts_its_graphs():
    # the compiled step (static cache, 3 new tokens padded to a bucket of 4) gives the eager logits; a
    # longer cache (the key length is a dynamic dimension) compiles nothing new
    eager = tiny_llama(seed=3)
    compiled = tiny_llama(seed=3)
    compiled.compile, compiled.steps.kernel = True, "onednn"  # one variant: one graph per shape
    ce, cc = eager.new_cache(), compiled.new_cache()
    eager.forward(ce, torch.tensor([PROMPT]))
    compiled.forward(cc, torch.tensor([PROMPT]))  # the prompt runs eagerly
    assert compiled.compiles == 0
    for tokens in ([9, 4, 33], [2, 40, 11], [5, 8, 30]):
        step = torch.tensor([tokens])
        assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
        assert cc.length == ce.length
    assert compiled.compiles == 1 and compiled.compile_seconds > 0
    # a rollback is a length change on the compiled path too
    compiled.crop(cc, len(PROMPT) + 1)
    eager.crop(ce, len(PROMPT) + 1)
    step = torch.tensor([[7, 7, 1]])
    assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
    assert compiled.compiles == 1


@pytest.mark.slow
def test_a_compiled_step_writes_new_cache_entries_in_place(monkeypatch):
    # a write into a view of a cache buffer (the values without their column of ones) is exported as a scatter
    # into a copy of the whole buffer: a step whose cost grows with the cache's capacity. The step writes whole
    # entries into the buffers themselves
    eager, compiled = tiny_llama(seed=3), tiny_llama(seed=3)
    compiled.compile, compiled.steps.kernel = True, "onednn"
    programs = []
    export = packaged.export
    monkeypatch.setattr(packaged, "export", lambda *args: programs.append(export(*args)) or programs[-1])
    ce, cc = eager.new_cache(), compiled.new_cache()
    for model, cache in ((eager, ce), (compiled, cc)):
        model.forward(cache, torch.tensor([PROMPT]))
    step = torch.tensor([[9, 4]])
    assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
    (program,) = programs
    # functional, as inductor compiles it: a write into a view becomes a scatter into its base
    graph = program.run_decompositions({}).graph
    ops = [str(node.target) for node in graph.nodes if node.op == "call_function"]
    layers = compiled.model.config.num_hidden_layers
    assert ops.count("aten.index_copy.default") == 2 * layers  # keys and values, per layer
    assert not [op for op in ops if "scatter" in op]
    for held, want in zip(cc.values, ce.values, strict=True):  # the column of ones stays
        assert torch.equal(held[..., -1], torch.ones_like(held[..., -1]))
        assert torch.allclose(held[:, :, : cc.length], want[:, :, : ce.length], atol=1e-5)


@pytest.mark.slow
def test_a_routed_bucket_runs_the_larger_graph_with_the_same_logits():
    # with the bucket of 4 routed to the 8 (as a measured cost curve does where the 8's kernel ran faster),
    # feeds of 3 and of 6 tokens run one graph, and give the eager logits
    eager, compiled = tiny_llama(seed=4), tiny_llama(seed=4)
    compiled.compile, compiled.steps.kernel = True, "onednn"
    compiled.bucket_route[4] = 8
    ce, cc = eager.new_cache(), compiled.new_cache()
    eager.forward(ce, torch.tensor([PROMPT]))
    compiled.forward(cc, torch.tensor([PROMPT]))
    for tokens in ([9, 4, 33], [2, 40, 11, 7, 7, 1]):
        step = torch.tensor([tokens])
        assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
        assert cc.length == ce.length
    assert compiled.compiles == 1


@pytest.mark.slow
def test_compiled_steps_do_not_recompile_as_the_cache_grows():
    # the cache's capacity doubles (512 -> 1024 slots) during compiled steps, so the key blocks the values product
    # reads (768 slots) stop filling the buffer: one graph throughout
    model = tiny_llama(seed=5, max_positions=700)
    model.compile, model.steps.kernel = True, "onednn"
    cache = model.new_cache()
    model.forward(cache, torch.tensor([[(5 * i + 1) % 64 for i in range(505)]]))
    for step in range(8):
        model.forward(cache, torch.tensor([[step, 7, 9]]))
        model.crop(cache, cache.length - 1)  # as a rejected draft is dropped
    assert cache.length == 505 + 8 * 2 > 512
    assert model.compiles == 1


@pytest.mark.slow
def test_compiled_models_of_one_shape_keep_their_own_weights():
    # two models of one architecture, compiled in one process and stepped in turn: each step runs the graph
    # holding its own frozen weights (the compiled steps drop dynamo's guards on the modules, so nothing but
    # each model's own compile keeps them apart)
    models = []
    for seed in (3, 4):
        eager, compiled = tiny_llama(seed=seed), tiny_llama(seed=seed)
        compiled.compile, compiled.steps.kernel = True, "onednn"
        ce, cc = eager.new_cache(), compiled.new_cache()
        eager.forward(ce, torch.tensor([PROMPT]))
        compiled.forward(cc, torch.tensor([PROMPT]))
        models.append((eager, compiled, ce, cc))
    for tokens in ([9, 4, 33], [2, 40, 11], [5, 8, 30]):
        for eager, compiled, ce, cc in models:
            step = torch.tensor([tokens])
            assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
    assert [m[1].compiles for m in models] == [1, 1]


def test_a_model_that_cannot_compile_runs_eagerly_with_one_line_saying_why(monkeypatch, capsys):
    # a compile that fails (here: torch.compile itself raising) leaves the cache's generation decoding eagerly,
    # same logits; the model stays compiled for the next cache
    eager, compiled = tiny_llama(seed=3), tiny_llama(seed=3)
    compiled.compile = True

    def refuse(*_, **__):
        raise RuntimeError("inductor cannot lower this model")

    monkeypatch.setattr(torch, "compile", refuse)
    monkeypatch.setattr(packaged, "build", refuse)  # the export to a package fails first, then torch.compile
    ce, cc = eager.new_cache(), compiled.new_cache()
    for cache, model in ((ce, eager), (cc, compiled)):
        model.forward(cache, torch.tensor([PROMPT]))
    step = torch.tensor([[9, 4, 33]])
    assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-5)
    assert cc.length == ce.length and not cc.compiled and compiled.compile and compiled.compiles == 0
    err = capsys.readouterr().err
    assert "compiled in memory, per process: it does not export (RuntimeError: inductor cannot lower" in err
    assert err.count("runs uncompiled: a compiled step failed (RuntimeError: inductor cannot lower this model)") == 1
    assert len(compiled.fallbacks) == 1
    assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-5)  # eagerly from now on
    assert "compile failed" not in capsys.readouterr().err


def _nodes_differing_from_one_token_steps(model, past: int = 150) -> int:
    """Score a 28-node tree in one forward after `past` cached tokens, and each node again as one-token steps
    along its path (how `ar` reaches it): how many nodes' logits are not bit for bit the same."""
    ids = torch.randint(256, (1, past + 50), generator=torch.Generator().manual_seed(1))
    tree = TokenTree.from_branching([4, 2, 1, 1])
    tokens = ids[:, past : past + tree.size]
    cache = model.new_cache()
    model.forward(cache, ids[:, :past], logits_to_keep=1)
    mask = torch.zeros(1, tree.size, past + tree.size, dtype=torch.bool)
    mask[:, :, :past] = True
    mask[0, :, past:] = tree.visible
    scored = model.forward(cache, tokens, positions=(past + tree.depth - 1)[None], mask=mask, logits_to_keep=tree.size)[
        0
    ]
    differing = 0
    for node in range(tree.size):
        cache = model.new_cache()
        model.forward(cache, ids[:, :past], logits_to_keep=1)
        for g in tree.path(node):
            logits = model.forward(cache, tokens[:, g : g + 1], logits_to_keep=1)[0, -1]
        differing += not torch.equal(logits, scored[node])
    return differing


def test_bfloat16_scoring_is_batch_invariant(monkeypatch):
    # a token's logits do not depend on how many tokens, or which tree, were scored with it: greedy
    # speculative decoding in bfloat16 then gives greedy ar's tokens
    model = _bf16_llama()
    with model._eager_kernels():  # (measured with the kernels its eager steps run: ours where they are chosen)
        assert model.min_rows == hf.invariant_rows(model.model) >= 1
    assert _nodes_differing_from_one_token_steps(model) == 0
    # the known-wrong variant: unpadded one-row products and few-row attention
    monkeypatch.setattr(static, "query_rows", lambda *shapes: 1)
    model._min_rows = 1
    if _nodes_differing_from_one_token_steps(model) == 0:
        pytest.skip("this machine's kernels give the same bits for any row count: the wrong variant shows nothing")


def _invariant_llama(kind: str):
    """The default target's layer shapes in bfloat16, its compiled steps batch-invariant in variant `kind`."""
    model = _bf16_llama(hidden=576, intermediate=1536)
    model.compile, model.steps.kernel, model.steps._invariant_kind = True, hf.INVARIANT, kind
    return model


@pytest.mark.slow
@pytest.mark.parametrize("kind", [hf.INVARIANT_DPBF16, hf.INVARIANT])
def test_batch_invariant_compiled_steps_give_a_tree_node_the_bits_of_one_token_steps(tmp_path, monkeypatch, kind):
    # compile="invariant": a 28-node tree scored in one compiled step (the bucket of 32) gives every node the
    # logits that compiled one-token steps along its path give, bit for bit, as the eager step does. The model
    # has the default target's layer shapes (9 heads of 64, 3 key-value heads, 1536 hidden in the MLP) and 200
    # cached tokens: there attention traced into the graph gives a tree's nodes other bits than steps (a
    # known-wrong variant below). Both variants: our kernel (unpadded rows) and oneDNN (rows padded)

    model = _invariant_llama(kind)
    if kind == hf.INVARIANT_DPBF16:
        if model.steps.offers(hf.DPBF16) is not None:
            pytest.skip(f"our kernel does not run here: {model.steps.offers(hf.DPBF16)}")
        assert model.steps.invariant_padding() == 1 and model.steps.invariant_kind() == kind
    else:
        assert model.steps.invariant_padding() == model.min_rows
    assert _nodes_differing_from_one_token_steps(model, past=200) == 0
    # the tree's bucket and the steps', kept on disk: the same weights in another model load them
    # (on our kernel, the cache holds bfloat16, and the packages take it so)
    stored = f"{kind}-kv-bfloat16" if kind == hf.INVARIANT_DPBF16 else kind
    assert model.kv_storage() == (torch.bfloat16 if kind == hf.INVARIANT_DPBF16 else torch.float32)
    assert model.compiles >= 2 and {kind for kind, _ in model.steps._packages} == {stored}
    again = _invariant_llama(kind)
    assert _nodes_differing_from_one_token_steps(again, past=200) == 0
    assert again.compiles == 0 and again.steps._packages.keys() == model.steps._packages.keys()
    # the tree's bucket was checked against one-token steps on this machine when it first ran (a chain of 32)
    assert model.steps.invariance[32] == 0 and again.steps.invariance[32] == 0
    # drafts fed with the prompt (the engine's first forward) go through a compiled step, as they do when
    # the prompt came alone (`ar`); fed eagerly with it (the known-wrong variant), they get other bits
    chain = _scored_after_a_prompt(model, 4, step_by_step=False)
    assert torch.equal(chain, _scored_after_a_prompt(model, 4, step_by_step=True))
    whole = hf.HFModel._prompt_then_steps
    monkeypatch.setattr(
        hf.HFModel,
        "_prompt_then_steps",
        lambda self, cache, tokens, positions, mask, keep, fused, invariant: self.forward(
            cache, tokens, positions, mask, keep, 0, invariant
        ),
    )
    wrong = _scored_after_a_prompt(model, 4, step_by_step=False)
    monkeypatch.setattr(hf.HFModel, "_prompt_then_steps", whole)
    # known-wrong variants: the invariant step with attention traced into the graph (no splits), and the fast
    # compiled step (attention traced, rows unpadded, a kernel per bucket)
    step_for = hf.CompiledSteps._step_for
    monkeypatch.setattr(hf.CompiledSteps, "_step_for", lambda self, kind: self.hf.step)
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "traced" / "forward_cost.json"))  # not the packages above
    traced = _invariant_llama(kind)
    traced = _nodes_differing_from_one_token_steps(traced, past=200)
    monkeypatch.setattr(hf.CompiledSteps, "_step_for", step_for)
    fast = _bf16_llama(hidden=576, intermediate=1536)
    fast.compile, fast.steps.kernel = True, "onednn"
    if traced == 0 or _nodes_differing_from_one_token_steps(fast, past=200) == 0 or torch.equal(wrong, chain):
        pytest.skip("this machine gives the same bits either way: a known-wrong variant shows nothing")
    # where the fast step's kernels change with the rows after as many cached tokens as the check that runs on
    # first use has (`INVARIANCE_PROMPT`), that check finds it (on an AMX host the fast step's bits differed only
    # after more cached tokens)
    if _nodes_differing_from_one_token_steps(fast, past=hf.kernels.INVARIANCE_PROMPT) == 0:
        pytest.skip("here the fast step's bits change with the rows only after more cached tokens than the check has")
    assert fast.steps._probe_invariance(32) > 0


def test_a_batch_invariant_step_that_fails_its_check_says_so_and_the_machine_remembers(tmp_path, monkeypatch, capsys):
    # the outcome of `CompiledSteps.check_invariance` (its probe is the real forwards, checked above) is kept beside the
    # kernel choices for these weights: a later model of the same weights says so again without probing

    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    probed = []
    monkeypatch.setattr(hf.CompiledSteps, "_probe_invariance", lambda self, width: probed.append(width) or 3)
    first, again = (hf.HFModel(tiny_llama(seed=4).model, None, name="tiny", compile="invariant") for _ in range(2))
    first.steps.check_invariance(1)  # the one-token step's own bucket: nothing to compare
    first.steps.check_invariance(8)
    assert probed == [8] and first.steps.invariance == {1: 0, 8: 3}
    assert "step for 8 new tokens gave 3 of 8 tokens other logits than one-token steps" in capsys.readouterr().err
    again.steps.check_invariance(8)
    assert probed == [8] and again.steps.invariance == {8: 3} and "gave 3 of 8" in capsys.readouterr().err
    other = hf.HFModel(tiny_llama(seed=5).model, None, name="tiny", compile="invariant")
    other.steps.check_invariance(8)  # other weights: probed again
    assert probed == [8, 8]


def test_compile_takes_auto_true_false_invariant_or_fast():
    from multispec.api import describe_model
    from multispec.models.hf import HFModel

    model = tiny_llama().model
    with pytest.raises(ValueError, match="compile='quick'"):
        HFModel(model, None, compile="quick")
    invariant = HFModel(model, None, name="tiny", compile="invariant")
    assert invariant.compile and invariant.steps.kernel == "invariant"
    assert describe_model(invariant).endswith("compiled, batch-invariant")
    # True: batch-invariant where that costs no more here (decided at the first compiled step); "fast": never
    auto, fast = HFModel(model, None, name="tiny", compile=True), HFModel(model, None, name="tiny", compile="fast")
    assert auto.steps.kernel == fast.steps.kernel == "auto" and auto.compile and fast.compile
    assert auto.steps._exact is None and fast.steps._exact is False and fast.steps.resolve_kernel() == "auto"
    from multispec.entrypoints.cli import _compile, build_parser

    def compile_of(*flags):
        return _compile(build_parser().parse_args(["generate", "hi", *flags]))

    assert [
        compile_of(),
        compile_of("--compile"),
        compile_of("--compile", "--invariant"),
        compile_of("--compile", "--fast"),
        compile_of("--fast"),
        compile_of("--eager"),
    ] == ["auto", True, "invariant", "fast", "fast", False]
    with pytest.raises(SystemExit, match="opposite"):
        compile_of("--compile", "--invariant", "--fast")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_whose_logits_differ_through_our_attention_keeps_the_dynamic_cache(dtype, monkeypatch, capsys):
    # attention that attends to nothing stands for a family our attention function gets wrong: the probe must
    # see it in either precision (in bfloat16 it is allowed only transformers' own spread between attentions)
    from multispec.models import static
    from multispec.models.hf import HFModel

    model = tiny_llama(seed=1).model.to(dtype)
    assert HFModel(model, None).static
    real = static.attend
    monkeypatch.setattr(static, "attend", lambda *args: 0 * real(*args))
    wrong = HFModel(model, None, name="wrong")
    assert not wrong.static
    assert "wrong keeps transformers' dynamic cache" in capsys.readouterr().err
    assert generate(wrong, None, PROMPT, method="ar", temperature=0, max_new_tokens=4).token_ids  # still decodes
