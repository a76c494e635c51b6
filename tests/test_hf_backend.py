"""The Hugging Face backend on tiny random Llamas: tree masks, cache operations, greedy equivalence."""

import copy
import json
from pathlib import Path

import pytest
import torch

from multispec import generate
from multispec.engine import Entries, ModelRunner
from multispec.models import hf, packaged, static
from multispec.trees import TokenTree
from tests.conftest import tiny_llama

PROMPT = [5, 17, 3, 42, 8, 11]


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    # compiled steps are kept on disk beside the cost file: each test has its own folder, so that none loads a
    # step another test compiled
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))


def full_logits(model, ids):
    """Reference: the model run on one linear sequence with no cache."""
    with torch.no_grad():
        return model.model(torch.tensor([ids])).logits[0].float()


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


def test_compacted_cache_equals_linear_cache():
    model = tiny_llama(seed=2)
    tree = TokenTree.from_parents([-1, -1, 0, 1, 1, 4])
    tokens = torch.tensor([7, 9, 13, 21, 22, 30])
    runner = ModelRunner(model)
    runner.feed([PROMPT], Entries.tree(tree, tokens))
    accepted = tree.path(5)  # nodes 1, 4, 5
    endpoint = 33
    committed = PROMPT + tokens[accepted].tolist() + [endpoint]
    runner.commit(len(committed), [accepted])
    linear = ModelRunner(model)
    linear.feed([committed[:-1]])
    for (ka, va), (kb, vb) in zip(runner.cache.held(), linear.cache.held(), strict=True):
        assert ka.shape == kb.shape
        assert torch.allclose(ka, kb, atol=1e-5) and torch.allclose(va, vb, atol=1e-5)
    # and the next step from the compacted cache is the linear one
    assert torch.allclose(runner.feed([committed])[0, -1], full_logits(model, committed)[-1], atol=1e-4)


def test_a_commit_and_a_row_reorder_cost_the_same_torch_calls_whatever_the_layer_count():
    # layers of one shape share one cache buffer: a tree commit moves the accepted entries of every layer in a
    # few calls (it made two per layer buffer, ~100 a tree iteration on the default target), as does a reorder
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    def calls(layers: int, rows: bool) -> int:
        model = tiny_llama(seed=2, layers=layers)
        cache = model.new_cache()
        assert len(cache.key_buffers) == len(cache.value_buffers) == 1 and len(cache.keys) == layers
        model.forward(cache, torch.tensor([PROMPT] * 2))
        Count.calls = 0
        with Count():
            if rows:
                model.select_rows(cache, torch.tensor([1, 0]))
            else:
                model.keep_positions(cache, torch.tensor([0, 1, 2, 5, 4]))
        return Count.calls

    assert calls(2, rows=False) == calls(6, rows=False)
    assert calls(2, rows=True) == calls(6, rows=True)


def test_select_rows_reorders_beams():
    model = tiny_llama(seed=3)
    cache = model.new_cache()
    batch = torch.tensor([PROMPT, PROMPT[::-1], [1, 2, 3, 4, 5, 6]])
    model.forward(cache, batch)
    model.select_rows(cache, torch.tensor([2, 0, 0]))
    nxt = torch.tensor([[4], [5], [6]])
    got = model.forward(cache, nxt)[:, -1]
    for row, (src, tok) in enumerate([(2, 4), (0, 5), (0, 6)]):
        ref = full_logits(model, batch[src].tolist() + [tok])[-1]
        assert torch.allclose(got[row], ref, atol=1e-4)


def test_a_reorder_moves_only_what_the_rows_do_not_hold_alike():
    # beams share their prompt: spread from one row, the rows hold it alike, and a reorder moves only the
    # tokens after it; a crop or a keep below that point shortens the shared part, and the logits stay right
    model = tiny_llama(seed=3)
    cache = model.new_cache()
    model.forward(cache, torch.tensor([PROMPT]))
    model.select_rows(cache, torch.tensor([0, 0, 0]))
    assert cache.shared == len(PROMPT) and cache.rows == 3
    seqs = [PROMPT + [t] for t in (4, 5, 6)]
    model.forward(cache, torch.tensor([[4], [5], [6]]))
    moves = []
    original = torch.Tensor.index_select

    def spy(self, dim, index):
        moves.append(self.shape[-2] if self.dim() == 5 else None)
        return original(self, dim, index)

    torch.Tensor.index_select = spy
    try:
        model.select_rows(cache, torch.tensor([2, 0, 1]))
    finally:
        torch.Tensor.index_select = original
    assert set(m for m in moves if m is not None) == {1}  # one entry per row moved, not the prompt's
    seqs = [seqs[2], seqs[0], seqs[1]]
    model.crop(cache, len(PROMPT) - 2)  # back into the prompt: rows diverge from there
    assert cache.shared == len(PROMPT) - 2
    tails = [[7, 8, 9], [9, 8, 7], [1, 1, 2]]
    model.forward(cache, torch.tensor(tails))
    seqs = [PROMPT[:-2] + t for t in tails]
    model.select_rows(cache, torch.tensor([1, 1, 2]))
    assert cache.shared == len(PROMPT) - 2
    seqs = [seqs[1], seqs[1], seqs[2]]
    got = model.forward(cache, torch.tensor([[3], [4], [5]]))[:, -1]
    for row, tok in enumerate((3, 4, 5)):
        assert torch.allclose(got[row], full_logits(model, seqs[row] + [tok])[-1], atol=1e-4)


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
    sd = generate(target, draft, PROMPT, method="sd", gamma=gamma, confidence=confidence, temperature=0,
                  max_new_tokens=40)
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
    r = generate(target, draft, PROMPT, method="batch-sd", drafts=drafts, gamma=gamma, temperature=0,
                 max_new_tokens=30)
    assert r.token_ids == ar.token_ids


def test_sampled_batch_sd_uses_tree_masks_consistently():
    # with the target as its own draft, the draft's level-by-level tree forwards must give the same
    # distributions as the target's single tree forward: then nothing is ever rejected
    target = tiny_llama(seed=7)
    r = generate(target, target, PROMPT, method="batch-sd", drafts=3, gamma=4, max_new_tokens=40, seed=1)
    assert r.stats["rejections"] == 0 and r.stats["target_calls"] == 8


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 12])
def test_static_cache_gives_the_models_own_logits(n):
    model = tiny_llama(seed=2)
    assert model.static
    cache = model.new_cache()
    model.forward(cache, torch.tensor([PROMPT]))
    tokens = torch.tensor([[9, 4, 33, 21, 7, 2, 40, 11, 5, 8, 30, 17][:n]])
    with torch.no_grad():
        got = model.forward(cache, tokens)
        want = full_logits(model, PROMPT + tokens[0].tolist())[None, -n:]
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-5)
        # a rollback is a length change; logits_to_keep keeps the last positions only
        model.crop(cache, len(PROMPT))
        assert cache.length == len(PROMPT)
        assert torch.allclose(model.forward(cache, tokens, logits_to_keep=1), want[:, -1:], atol=1e-5)


def test_compiled_forward_equals_eager_and_counts_its_graphs(tmp_path, monkeypatch):
    # the compiled step (static cache, 3 new tokens padded to a bucket of 4) gives the eager logits; a
    # longer cache (the key length is a dynamic dimension) compiles nothing new
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    eager = tiny_llama(seed=3)
    compiled = tiny_llama(seed=3)
    compiled.compile, compiled.kernel = True, "onednn"  # one variant: one graph per shape
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


def test_a_compiled_step_writes_new_cache_entries_in_place(tmp_path, monkeypatch):
    # a write into a view of a cache buffer (the values without their column of ones) is exported as a scatter
    # into a copy of the whole buffer: a step whose cost grows with the cache's capacity. The step writes whole
    # entries into the buffers themselves
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    eager, compiled = tiny_llama(seed=3), tiny_llama(seed=3)
    compiled.compile, compiled.kernel = True, "onednn"
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


def test_a_routed_bucket_runs_the_larger_graph_with_the_same_logits(tmp_path, monkeypatch):
    # with the bucket of 4 routed to the 8 (as a measured cost curve does where the 8's kernel ran faster),
    # feeds of 3 and of 6 tokens run one graph, and give the eager logits
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    eager, compiled = tiny_llama(seed=4), tiny_llama(seed=4)
    compiled.compile, compiled.kernel = True, "onednn"
    compiled.bucket_route[4] = 8
    ce, cc = eager.new_cache(), compiled.new_cache()
    eager.forward(ce, torch.tensor([PROMPT]))
    compiled.forward(cc, torch.tensor([PROMPT]))
    for tokens in ([9, 4, 33], [2, 40, 11, 7, 7, 1]):
        step = torch.tensor([tokens])
        assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
        assert cc.length == ce.length
    assert compiled.compiles == 1


def test_compiled_steps_do_not_recompile_as_the_cache_grows(tmp_path, monkeypatch):
    # the cache's capacity doubles (512 -> 1024 slots) during compiled steps, so the key blocks the values product
    # reads (768 slots) stop filling the buffer: one graph throughout
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = tiny_llama(seed=5, max_positions=700)
    model.compile, model.kernel = True, "onednn"
    cache = model.new_cache()
    model.forward(cache, torch.tensor([[(5 * i + 1) % 64 for i in range(505)]]))
    for step in range(8):
        model.forward(cache, torch.tensor([[step, 7, 9]]))
        model.crop(cache, cache.length - 1)  # as a rejected draft is dropped
    assert cache.length == 505 + 8 * 2 > 512
    assert model.compiles == 1


def test_each_compiled_shape_keeps_the_kernel_variant_that_ran_fastest_here(tmp_path, monkeypatch, capsys):
    # first use of a shape on a machine: the step is compiled in every variant, each timed whole in place, and
    # the fastest kept (stored for the machine, with every timing)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    eager, compiled = tiny_llama(seed=6), tiny_llama(seed=6)
    compiled.compile = True
    assert compiled.kernel == "auto"
    ce, cc = eager.new_cache(), compiled.new_cache()
    eager.forward(ce, torch.tensor([PROMPT]))
    compiled.forward(cc, torch.tensor([PROMPT]))
    for tokens in ([9, 4, 33], [2, 40, 11]):
        step = torch.tensor([tokens])
        assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
    # a graph per variant of KERNELS that runs here (our bfloat16 kernel does not take float32), one more for the
    # faster with its products concatenated; none after the choice
    assert compiled.offers(hf.DPBF16) == "it multiplies bfloat16 on a CPU"
    assert compiled.compiles == len(hf.KERNELS) - 1 + 1 == 3
    kept = compiled.kernels[(1, 4)]
    assert kept in hf.VARIANTS
    err = capsys.readouterr().err
    assert "(onednn kernels)" in err and "(autotuned kernels)" in err and f"keeps {kept}" in err
    stored = json.loads((tmp_path / "compiled_kernels.json").read_text())
    (entry,) = stored.values()
    timed = set(entry["1x4"]["step_ms"])
    (concat,) = timed - set(hf.KERNELS)
    assert entry["1x4"]["kernel"] == kept and timed == {*hf.KERNELS, concat} - {hf.DPBF16}
    assert concat.removesuffix(hf.CONCAT) in hf.KERNELS and f"({concat} kernels)" in err
    assert entry["1x4"]["step_ms"][kept] == min(entry["1x4"]["step_ms"].values())  # the faster one is kept
    # later steps run the kept variant's graph and match
    step = torch.tensor([[7, 1, 30]])
    assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
    # only the kept variant's compiled step stays on disk
    assert [p.name for p in (tmp_path / "compiled").rglob("*.pt2")] == [f"{kept}-1x4.pt2"]
    # another process on this machine (here: a fresh model of the same weights) loads it and compiles nothing
    again = tiny_llama(seed=6)
    again.compile = True
    ca = again.new_cache()
    again.forward(ca, torch.tensor([PROMPT]))
    want = eager.forward(eager.new_cache(), torch.tensor([PROMPT + [9, 4, 33]]))[:, -3:]
    assert torch.allclose(again.forward(ca, torch.tensor([[9, 4, 33]])), want, atol=1e-4)
    assert again.compiles == 0 and again.kernels == {(1, 4): kept}
    assert f"loaded the compiled step of tiny-llama-64-6 for 1 x 4 new tokens ({kept} kernels)" in capsys.readouterr().err


def _products(package: Path) -> int:
    """Matrix products (oneDNN linear maps) the packaged step's generated code calls."""
    import re
    import zipfile

    with zipfile.ZipFile(package) as z:
        source = "".join(z.read(n).decode() for n in z.namelist() if n.endswith("wrapper.cpp"))
    return len(re.findall(r"aoti_torch_cpu__linear_pointwise\w*\(", source))


def test_the_concat_variant_makes_the_products_that_read_one_input_one(tmp_path, monkeypatch):
    # a layer's query, key and value maps become one product, its gate and up maps another: 7 products a layer
    # and the head -> 4 a layer and the head; the logits stay the eager step's
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    eager = tiny_llama(seed=6)
    want = eager.forward(eager.new_cache(), torch.tensor([PROMPT + [9, 4, 33]]))[:, -3:]
    counts = {}
    for kind in ("onednn", "onednn" + hf.CONCAT):
        model = tiny_llama(seed=6)
        model.compile, model.kernel = True, kind
        cache = model.new_cache()
        model.forward(cache, torch.tensor([PROMPT]))
        assert torch.allclose(model.forward(cache, torch.tensor([[9, 4, 33]])), want, atol=1e-4)
        (package,) = (tmp_path / "compiled").rglob(f"{kind}-1x4.pt2")
        counts[kind] = _products(package)
    assert counts == {"onednn": 2 * 7 + 1, "onednn+concat": 2 * 4 + 1}
    with pytest.raises(ValueError, match="one of onednn, autotuned, dpbf16, onednn"):
        hf.kernel_options("concat")


def test_a_compiled_step_is_kept_on_disk_for_its_own_weights_and_a_damaged_one_is_made_again(tmp_path, capsys,
                                                                                          monkeypatch):
    # a later process loads the step compiled by an earlier one (nothing compiled); a model of another
    # checkpoint under the same name does not get it; a damaged package is compiled again
    def run(seed, name="tiny"):
        eager, compiled = tiny_llama(seed=seed), tiny_llama(seed=seed)
        compiled.name, compiled.compile, compiled.kernel = name, True, "onednn"
        ce, cc = eager.new_cache(), compiled.new_cache()
        eager.forward(ce, torch.tensor([PROMPT]))
        compiled.forward(cc, torch.tensor([PROMPT]))
        for tokens in ([9, 4], [33, 21]):
            step = torch.tensor([tokens])
            assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
        return compiled.compiles

    stale = put_package("older", "tiny|torch.float32|cpu|compiled|threads=2|weights=0")  # no step version
    assert run(seed=9) == 1
    assert not stale.exists() and "removed 1 compiled step(s) of an older graph" in capsys.readouterr().err
    (package,) = (tmp_path / "compiled").rglob("onednn-1x2.pt2")
    assert run(seed=9) == 0 and "loaded the compiled step of tiny" in capsys.readouterr().err
    assert run(seed=10) == 1  # same name and architecture, other weights
    assert len(list((tmp_path / "compiled").rglob("*.pt2"))) == 2
    package.write_bytes(b"not a package")
    assert run(seed=9) == 1

    # past the size limit, a compile removes the least recently used packages (seed 10's, then seed 9's)
    from multispec.cli import main

    size = package.stat().st_size
    monkeypatch.setenv("MULTISPEC_COMPILED_LIMIT_GB", str(1.5 * size / 1e9))
    capsys.readouterr()
    assert run(seed=11) == 1
    assert "removed 2 least recently used compiled step(s)" in capsys.readouterr().err
    (kept,) = (tmp_path / "compiled").rglob("*.pt2")
    assert run(seed=11) == 0
    assert main(["compiled"]) == 0
    listed = capsys.readouterr().out
    assert "1 compiled step(s)" in listed and "tiny  torch.float32  onednn-1x2" in listed
    assert main(["compiled", "--clear"]) == 0 and "removed 1 compiled step(s)" in capsys.readouterr().out
    assert not list((tmp_path / "compiled").iterdir())
    monkeypatch.setenv("MULTISPEC_COMPILED_LIMIT_GB", "lots")
    with pytest.raises(ValueError, match="MULTISPEC_COMPILED_LIMIT_GB='lots': give the gigabytes"):
        run(seed=11)


def put_package(folder: str, key: str) -> Path:
    """A file where a compiled step of `key` would be kept (not a package: enough to list and remove)."""
    path = packaged.folder() / folder / "onednn-1x1.pt2"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x" * 1000)
    (path.parent / "key.json").write_text(json.dumps({"key": key}))
    return path


def test_steps_of_another_compiled_graph_are_listed_stale_and_cleared(capsys):
    from multispec.cli import main

    now = put_package("now", f"tiny|torch.float32|cpu|compiled|threads=2|step={hf.STEP_VERSION}|weights=0")
    old = put_package("old", "tiny|torch.float32|cpu|compiled|threads=2|weights=0")
    older = put_package("older", f"tiny|torch.float32|cpu|compiled+invariant|step={hf.STEP_VERSION - 1}|weights=0")
    assert [p["stale"] for p in sorted(packaged.packages(), key=lambda p: str(p["path"]))] == [False, True, True]
    assert main(["compiled"]) == 0
    listed = capsys.readouterr().out
    assert "3 compiled step(s)" in listed and listed.count("stale") == 2
    assert main(["compiled", "--clear", "--stale"]) == 0
    assert "removed 2 compiled step(s)" in capsys.readouterr().out
    assert now.exists() and not old.exists() and not older.exists()
    assert packaged.prune_stale() == []


def test_compiled_models_of_one_shape_keep_their_own_weights(tmp_path, monkeypatch):
    # two models of one architecture, compiled in one process and stepped in turn: each step runs the graph
    # holding its own frozen weights (the compiled steps drop dynamo's guards on the modules, so nothing but
    # each model's own compile keeps them apart)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    models = []
    for seed in (3, 4):
        eager, compiled = tiny_llama(seed=seed), tiny_llama(seed=seed)
        compiled.compile, compiled.kernel = True, "onednn"
        ce, cc = eager.new_cache(), compiled.new_cache()
        eager.forward(ce, torch.tensor([PROMPT]))
        compiled.forward(cc, torch.tensor([PROMPT]))
        models.append((eager, compiled, ce, cc))
    for tokens in ([9, 4, 33], [2, 40, 11], [5, 8, 30]):
        for eager, compiled, ce, cc in models:
            step = torch.tensor([tokens])
            assert torch.allclose(compiled.forward(cc, step), eager.forward(ce, step), atol=1e-4)
    assert [m[1].compiles for m in models] == [1, 1]


def test_a_stored_choice_of_an_unknown_variant_is_made_again_and_a_bad_kernel_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    model = tiny_llama(seed=8)
    model.compile = True
    (tmp_path / "compiled_kernels.json").write_text(json.dumps({hf._kernel_key(model): {"1x1": {"kernel": "gone"}}}))
    assert hf._stored_choice(model, (1, 1)) is None and hf._stored_choice(model, (1, 2)) is None
    model.kernel = "fastest"
    cache = model.new_cache()
    model.forward(cache, torch.tensor([PROMPT]))
    with pytest.raises(ValueError, match="kernel 'fastest': 'auto', 'invariant' or one of onednn, autotuned"):
        model.forward(cache, torch.tensor([[9]]))


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


def test_long_feeds_attend_in_blocks_of_queries(monkeypatch):
    # a prompt longer than the query block gives the logits of one block
    from multispec.models import static

    model = tiny_llama(seed=4)
    ids = [(7 * i + 3) % 64 for i in range(40)]
    whole = model.forward(model.new_cache(), torch.tensor([ids]))
    monkeypatch.setattr(static, "QUERY_CHUNK", 16)
    blocks = model.forward(model.new_cache(), torch.tensor([ids]))
    assert torch.allclose(blocks, whole, atol=1e-5)
    assert torch.allclose(blocks[0], full_logits(model, ids), atol=1e-4)


def test_query_blocks_of_a_prompt_read_only_the_keys_they_see_and_give_the_same_bits(monkeypatch):
    # each block of a causal prompt's queries reads the keys up to its last query's; the keys left out weigh
    # exactly 0, so the logits and the cache are those of one block over every key, bit for bit
    from multispec.models import static

    model = tiny_llama(seed=4)
    ids = torch.tensor([[(7 * i + 3) % 64 for i in range(40)]])

    def prefill():
        cache = model.new_cache()
        return model.forward(cache, ids), [k[:, :, : cache.length].clone() for k in cache.keys]

    whole, whole_keys = prefill()
    widths = []
    seen_width = static._seen_width
    monkeypatch.setattr(static, "_seen_width", lambda mask: widths.append(seen_width(mask)) or widths[-1])
    monkeypatch.setattr(static, "QUERY_CHUNK", 16)
    blocks, block_keys = prefill()
    assert widths[:3] == [16, 32, 40]  # the first layer's three blocks: causal, so block b sees 16 (b + 1) keys
    assert torch.equal(blocks, whole)
    assert all(torch.equal(a, b) for a, b in zip(block_keys, whole_keys, strict=True))
    # one key too few for each block (a known-wrong cut) changes the logits
    monkeypatch.setattr(static, "_seen_width", lambda mask: seen_width(mask) - 1)
    assert not torch.allclose(prefill()[0], whole, atol=1e-3)


def _attention_of_tree_and_steps(trials: int, splits: bool) -> int:
    """Random keys, values and bfloat16 queries of the default target's attention shapes; random trees (depth
    up to TAIL + 1) after a random number of cached slots. Each node's attention output in one tree forward
    (nodes at the slots of their tree index) against a one-query step at its position (its path at consecutive
    slots, as `ar` lays it out): how many nodes differ in any bit. With `splits`, both as the engine calls them."""
    from multispec.models import static

    gen = torch.Generator().manual_seed(3)
    heads, group, dim, minimum = 3, 3, 64, torch.finfo(torch.float32).min
    differing = 0
    for _ in range(trials):
        past = int(torch.randint(0, 600, (), generator=gen))
        parents = [-1]
        for g in range(1, 28):  # a random tree: each node's parent an earlier node, depth at most TAIL + 1
            parents.append(-1 if g < 3 else int(torch.randint(0, g, (), generator=gen)))
        tree = TokenTree.from_parents(parents)
        if int(tree.depth.max()) > static.TAIL + 1:
            continue
        n, width = tree.size, past + tree.size
        keys = torch.randn(1, heads, width, dim, generator=gen)
        values = static.with_ones(torch.randn(1, heads, static.whole_blocks(width), dim, generator=gen))
        query = torch.randn(1, heads * group, n, dim, generator=gen).to(torch.bfloat16)
        positions = past + tree.depth[None] - 1

        def attend(q, k, v, seen, pos):
            mask = torch.zeros(seen.shape).masked_fill_(~seen, minimum)[:, None]
            return static._attend_block(q, k, v, mask, 0.125, 0.0, split=static.splits(pos) if splits else None)

        seen = torch.zeros(1, n, width, dtype=torch.bool)
        seen[:, :, :past] = True
        seen[0, :, past:] = tree.visible
        scored = attend(query, keys, values, seen, positions)
        for node in range(n):
            path = tree.path(node)
            order = torch.cat([torch.arange(past), past + torch.tensor(path)])  # its path at consecutive slots
            k, v = keys[:, :, order], values[:, :, order]
            v = torch.nn.functional.pad(v, (0, 0, 0, static.whole_blocks(len(order)) - len(order)))
            step = attend(query[:, :, node : node + 1], k, v, torch.ones(1, 1, len(order), dtype=torch.bool),
                          positions[:, node : node + 1])
            differing += not torch.equal(step[:, :, 0], scored[:, :, node])
    return differing


def test_a_tree_nodes_attention_has_the_bits_of_a_step_at_its_position():
    # batch invariance for trees: a node's entries sit at its index in the tree, not at its position; each
    # query's last few values are summed in float64, so that this layout leaves no trace
    assert _attention_of_tree_and_steps(60, splits=True) == 0
    # the known-wrong variant: every slot in KEY_BLOCK products, where a term's place in the block matters
    if _attention_of_tree_and_steps(60, splits=False) == 0:
        pytest.skip("this machine's products give the same bits wherever a term sits: the wrong variant shows nothing")


def test_only_the_targets_forwards_pay_for_batch_invariance(monkeypatch):
    # the draft's logits never decide the output: its runner skips the padding and the float64 tails; the
    # target's eager bfloat16 forwards get each query's split
    from multispec.models import static
    from multispec.models.hf import HFModel

    target, draft = _bf16_llama(), _bf16_llama(hidden=192)
    seen, splits = [], []
    forward, real_splits = HFModel.forward, static.splits
    monkeypatch.setattr(HFModel, "forward", lambda self, *a, **k: seen.append((self is target, k.get("batch_invariant", True)))
                        or forward(self, *a, **k))
    monkeypatch.setattr(static, "splits", lambda positions: splits.append(positions.shape) or real_splits(positions))
    generate(target, draft, [5, 6, 7, 8], method="sd:gamma=3", temperature=0, max_new_tokens=8)
    assert {invariant for is_target, invariant in seen if is_target} == {True}
    assert {invariant for is_target, invariant in seen if not is_target} == {False}
    assert len(splits) == sum(is_target for is_target, _ in seen)  # one per target forward, none per draft's


def _bf16_llama(hidden: int = 384, intermediate: int | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    from multispec.models.hf import HFModel

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=intermediate or 6 * hidden,
                         num_hidden_layers=2,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 192,
                         max_position_embeddings=512, eos_token_id=None, bos_token_id=None, pad_token_id=None,
                         tie_word_embeddings=False)
    return HFModel(LlamaForCausalLM(config).to(torch.bfloat16), None, name=f"bf16-llama-{hidden}-{intermediate}")


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
    scored = model.forward(cache, tokens, positions=(past + tree.depth - 1)[None], mask=mask,
                           logits_to_keep=tree.size)[0]
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
    model.compile, model.kernel, model._invariant_kind = True, hf.INVARIANT, kind
    return model


@pytest.mark.parametrize("kind", [hf.INVARIANT_DPBF16, hf.INVARIANT])
def test_batch_invariant_compiled_steps_give_a_tree_node_the_bits_of_one_token_steps(tmp_path, monkeypatch, kind):
    # compile="invariant": a 28-node tree scored in one compiled step (the bucket of 32) gives every node the
    # logits that compiled one-token steps along its path give, bit for bit, as the eager step does. The model
    # has the default target's layer shapes (9 heads of 64, 3 key-value heads, 1536 hidden in the MLP) and 200
    # cached tokens: there attention traced into the graph gives a tree's nodes other bits than steps (a
    # known-wrong variant below). Both variants: our kernel (unpadded rows) and oneDNN (rows padded)

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = _invariant_llama(kind)
    if kind == hf.INVARIANT_DPBF16:
        if model.offers(hf.DPBF16) is not None:
            pytest.skip(f"our kernel does not run here: {model.offers(hf.DPBF16)}")
        assert model._invariant_padding() == 1 and model.invariant_kind() == kind
    else:
        assert model._invariant_padding() == model.min_rows
    assert _nodes_differing_from_one_token_steps(model, past=200) == 0
    # the tree's bucket and the steps', kept on disk: the same weights in another model load them
    # (on our kernel, the cache holds bfloat16, and the packages take it so)
    stored = f"{kind}-kv-bfloat16" if kind == hf.INVARIANT_DPBF16 else kind
    assert model.kv_storage() == (torch.bfloat16 if kind == hf.INVARIANT_DPBF16 else torch.float32)
    assert model.compiles >= 2 and {kind for kind, _ in model._packages} == {stored}
    again = _invariant_llama(kind)
    assert _nodes_differing_from_one_token_steps(again, past=200) == 0
    assert again.compiles == 0 and again._packages.keys() == model._packages.keys()
    # the tree's bucket was checked against one-token steps on this machine when it first ran (a chain of 32)
    assert model.invariance[32] == 0 and again.invariance[32] == 0
    # drafts fed with the prompt (the engine's first forward) go through a compiled step, as they do when
    # the prompt came alone (`ar`); fed eagerly with it (the known-wrong variant), they get other bits
    chain = _scored_after_a_prompt(model, 4, step_by_step=False)
    assert torch.equal(chain, _scored_after_a_prompt(model, 4, step_by_step=True))
    whole = hf.HFModel._prompt_then_steps
    monkeypatch.setattr(hf.HFModel, "_prompt_then_steps", lambda self, cache, tokens, positions, mask, keep, fused,
                        invariant: self.forward(cache, tokens, positions, mask, keep, 0, invariant))
    wrong = _scored_after_a_prompt(model, 4, step_by_step=False)
    monkeypatch.setattr(hf.HFModel, "_prompt_then_steps", whole)
    # known-wrong variants: the invariant step with attention traced into the graph (no splits), and the fast
    # compiled step (attention traced, rows unpadded, a kernel per bucket)
    step_for = hf.HFModel._step_for
    monkeypatch.setattr(hf.HFModel, "_step_for", lambda self, kind: self._step)
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "traced" / "forward_cost.json"))  # not the packages above
    traced = _invariant_llama(kind)
    traced = _nodes_differing_from_one_token_steps(traced, past=200)
    monkeypatch.setattr(hf.HFModel, "_step_for", step_for)
    fast = _bf16_llama(hidden=576, intermediate=1536)
    fast.compile, fast.kernel = True, "onednn"
    if traced == 0 or _nodes_differing_from_one_token_steps(fast, past=200) == 0 or torch.equal(wrong, chain):
        pytest.skip("this machine gives the same bits either way: a known-wrong variant shows nothing")
    # where the fast step's kernels change with the rows, the check that runs on first use finds it
    assert fast._probe_invariance(32) > 0


def test_a_batch_invariant_step_that_fails_its_check_says_so_and_the_machine_remembers(tmp_path, monkeypatch,
                                                                                        capsys):
    # the outcome of `_check_invariance` (its probe is the real forwards, checked above) is kept beside the
    # kernel choices for these weights: a later model of the same weights says so again without probing

    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    probed = []
    monkeypatch.setattr(hf.HFModel, "_probe_invariance", lambda self, width: probed.append(width) or 3)
    first, again = (hf.HFModel(tiny_llama(seed=4).model, None, name="tiny", compile="invariant") for _ in range(2))
    first._check_invariance(1)  # the one-token step's own bucket: nothing to compare
    first._check_invariance(8)
    assert probed == [8] and first.invariance == {1: 0, 8: 3}
    assert "step for 8 new tokens gave 3 of 8 tokens other logits than one-token steps" in capsys.readouterr().err
    again._check_invariance(8)
    assert probed == [8] and again.invariance == {8: 3} and "gave 3 of 8" in capsys.readouterr().err
    other = hf.HFModel(tiny_llama(seed=5).model, None, name="tiny", compile="invariant")
    other._check_invariance(8)  # other weights: probed again
    assert probed == [8, 8]


def test_compile_takes_true_false_invariant_or_fast():
    from multispec.api import describe_model
    from multispec.models.hf import HFModel

    model = tiny_llama().model
    with pytest.raises(ValueError, match="compile='quick'"):
        HFModel(model, None, compile="quick")
    invariant = HFModel(model, None, name="tiny", compile="invariant")
    assert invariant.compile and invariant.kernel == "invariant"
    assert describe_model(invariant).endswith("compiled, batch-invariant")
    # True: batch-invariant where that costs no more here (decided at the first compiled step); "fast": never
    auto, fast = HFModel(model, None, name="tiny", compile=True), HFModel(model, None, name="tiny", compile="fast")
    assert auto.kernel == fast.kernel == "auto" and auto.compile and fast.compile
    assert auto._exact is None and fast._exact is False and fast.resolve_kernel() == "auto"
    from multispec.cli import _compile, build_parser

    def compile_of(*flags):
        return _compile(build_parser().parse_args(["generate", "hi", *flags]))

    assert [compile_of(), compile_of("--compile"), compile_of("--compile", "--invariant"),
            compile_of("--compile", "--fast"), compile_of("--fast")] == [False, True, "invariant", "fast", False]
    with pytest.raises(SystemExit, match="opposite"):
        compile_of("--compile", "--invariant", "--fast")


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


def test_a_prompt_goes_in_through_fused_attention_and_what_follows_meets_the_same_bits(monkeypatch):
    # the first forward attends the prompt but its last token through torch's fused attention (every method
    # alike), the prompt's last token and the drafts through the steps' batch-invariant attention: in bfloat16 a
    # chain fed with the prompt gets the bits of one-token steps, so greedy sd stays greedy ar
    from transformers import AttentionInterface

    from multispec.models import static

    model = _bf16_llama()
    fused, everything = [], []

    def counted(module, query, *args, **kwargs):
        fused.append(kwargs.get("ms_fused", 0))
        if everything and kwargs.get("ms_fused"):  # the known-wrong variant: the drafts through it too
            kwargs["ms_fused"] = query.shape[2]
        return static.attention(module, query, *args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, static.NAME, counted)
    chain = _scored_after_a_prompt(model, 4, step_by_step=False)
    assert set(fused) == {199}  # every layer of the one forward
    assert torch.equal(chain, _scored_after_a_prompt(model, 4, step_by_step=True))
    # fused attention is close to the steps', not the same bits: scoring the drafts with it gives them other
    # logits than one-token steps
    everything.append(True)
    wrong = _scored_after_a_prompt(model, 4, step_by_step=False)
    assert torch.allclose(wrong, chain, rtol=0.05, atol=0.05 * chain.abs().max().item())
    if torch.equal(wrong, chain):
        pytest.skip("this machine's fused attention gives the steps' bits: the wrong variant shows nothing")


def test_a_prompt_fed_with_fused_attention_gives_the_models_own_logits():
    model = tiny_llama(seed=5, max_positions=512)
    ids = [(11 * i + 5) % 64 for i in range(300)]
    runner = ModelRunner(model)
    logits = runner.feed([ids[:290]], Entries.chain(ids[290:]))[0]
    assert runner.committed == 290 and model.static
    assert torch.allclose(logits, full_logits(model, ids)[289:], atol=1e-4)


def test_compiles_during_a_call_count_as_one_time_not_as_decoding(tmp_path, monkeypatch):
    # gamma=auto reads stored cost curves (no calibration), so the compiled steps' graphs are made inside the
    # call: their seconds (the process's first torch.compile included) are one-time costs, outside the target's
    # forward seconds and the controller's decoding speed
    from multispec.models.cost import _COSTS, COST_CONTEXTS, COST_TOKENS, cost_key

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))
    target, draft = tiny_llama(seed=11), tiny_llama(seed=12, layers=1)
    curves = {}
    for model, seconds in ((target, 0.01), (draft, 0.002)):
        model.compile, model.kernel = True, "onednn"
        _COSTS.pop(cost_key(model), None)
        curves[cost_key(model)] = {"contexts": list(COST_CONTEXTS), "tokens": list(COST_TOKENS),
                                   "seconds": [[seconds] * len(COST_TOKENS)] * len(COST_CONTEXTS)}
    (tmp_path / "forward_cost.json").write_text(json.dumps(curves))
    out = generate(target, draft, PROMPT, method="sd:gamma=auto", max_new_tokens=24, temperature=0)
    st = out.stats
    assert st["compiles"] >= 2 and st["one_time_seconds"] > 1.0  # graphs were made inside the call
    assert st["target_seconds"] + st["draft_seconds"] <= st["seconds"]
    assert st["decode_seconds"] <= st["seconds"]
    for model in (target, draft):
        _COSTS.pop(cost_key(model), None)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_maps_serve_eager_steps_only_and_keep_the_logits(dtype, monkeypatch):
    from multispec.models import linears

    if linears.packable(tiny_llama().model) is not None or (
            dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        pytest.skip("no oneDNN packing for this dtype here")
    monkeypatch.setattr(linears, "_CHOICES", {})
    monkeypatch.setattr(linears, "GAIN", float("inf"))  # packed whatever the timing said
    make = (lambda: tiny_llama(seed=6)) if dtype == torch.float32 else _bf16_llama
    plain, packed = make(), make()
    plain.packed_linears = False
    ids = torch.tensor([PROMPT])
    out_plain = plain.forward(plain.new_cache(), ids)
    out_packed = packed.forward(packed.new_cache(), ids)
    assert packed.packed_linears is True
    assert all(linears.packed_weight(m) is not None for m in packed.model.modules() if type(m) is torch.nn.Linear)
    assert torch.allclose(out_packed, out_plain, atol=1e-4 if dtype == torch.float32 else 0.05)
    # the packed weights are what eager steps read, and only they: with them zeroed, the steps change and
    # transformers' own calls on the model (the bench's hf peers) still give the plain model's bits
    for m in packed.model.modules():
        if type(m) is torch.nn.Linear:
            linears._PACKED[m] = (linears._PACKED[m][0], torch.ops.mkldnn._reorder_linear_weight(torch.zeros_like(m.weight), 1))
    assert not torch.allclose(packed.forward(packed.new_cache(), ids), out_plain, atol=0.05)
    with torch.inference_mode(), static.stock_attention(plain.model, packed.model):
        assert torch.equal(packed.model(ids).logits, plain.model(ids).logits)
    # a copy of the model (distill's bfloat16 teacher is one) is not packed: even in an eager step's context it
    # runs the plain weights
    clone = copy.deepcopy(packed.model)
    with torch.inference_mode(), linears.active(), static.stock_attention(clone, plain.model):
        assert torch.equal(clone(ids).logits, plain.model(ids).logits)


def test_linear_maps_stay_plain_where_packed_ran_no_faster_or_packing_is_switched_off(monkeypatch):
    from multispec.models import linears

    model = tiny_llama(seed=7)
    if linears.packable(model.model) is not None:
        pytest.skip("no oneDNN packing here")
    monkeypatch.setattr(linears, "_CHOICES", {})
    monkeypatch.setattr(linears, "GAIN", 0.0)  # packed would have to take no time at all
    model.forward(model.new_cache(), torch.tensor([PROMPT]))
    assert model.packed_linears is False
    assert not any(linears.packed_weight(m) is not None for m in model.model.modules() if type(m) is torch.nn.Linear)
    chosen, plain_seconds, packed_seconds = next(iter(linears._CHOICES.values()))
    assert chosen is False and plain_seconds > 0 and packed_seconds > 0
    monkeypatch.setenv("MULTISPEC_PACKED_LINEARS", "0")
    assert linears.packable(model.model) == "MULTISPEC_PACKED_LINEARS=0"
    fresh = tiny_llama(seed=7)
    fresh.forward(fresh.new_cache(), torch.tensor([PROMPT]))
    assert fresh.packed_linears is False
