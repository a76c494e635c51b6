import pytest
import torch

from multispec import generate
from multispec.engine import Entries, ModelRunner
from multispec.trees import TokenTree
from tests.conftest import tiny_llama
from tests.models.helpers import PROMPT, _bf16_llama, _scored_after_a_prompt, full_logits


@pytest.fixture(autouse=True)
def _own_store(tmp_path, monkeypatch):
    # compiled steps are kept on disk beside the cost file: each test has its own folder, so that none loads a
    # step another test compiled
    monkeypatch.setenv("MULTISPEC_COST_FILE", str(tmp_path / "forward_cost.json"))


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
            step = attend(
                query[:, :, node : node + 1],
                k,
                v,
                torch.ones(1, 1, len(order), dtype=torch.bool),
                positions[:, node : node + 1],
            )
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
    # target's eager bfloat16 forwards get each query's split (none where they attend through our kernel, whose
    # sums keep one order whatever the tree: `HFModel.kernel_attention`)
    from multispec.models import static
    from multispec.models.hf import HFModel

    target, draft = _bf16_llama(), _bf16_llama(hidden=192)
    seen, splits = [], []
    forward, real_splits = HFModel.forward, static.splits
    monkeypatch.setattr(
        HFModel,
        "forward",
        lambda self, *a, **k: seen.append((self is target, k.get("batch_invariant", True))) or forward(self, *a, **k),
    )
    monkeypatch.setattr(static, "splits", lambda positions: splits.append(positions.shape) or real_splits(positions))
    generate(target, draft, [5, 6, 7, 8], method="sd:gamma=3", temperature=0, max_new_tokens=8)
    assert {invariant for is_target, invariant in seen if is_target} == {True}
    assert {invariant for is_target, invariant in seen if not is_target} == {False}
    per_forward = 0 if target.kernel_attention() else 1
    assert len(splits) == per_forward * sum(is_target for is_target, _ in seen)  # none per draft's forward


def test_a_prompt_goes_in_through_fused_attention_and_what_follows_meets_the_same_bits(monkeypatch):
    # the first forward attends the prompt but its last token through torch's fused attention (every method
    # alike), the prompt's last token and the drafts through the steps' batch-invariant attention: in bfloat16 a
    # chain fed with the prompt gets the bits of one-token steps, so greedy sd stays greedy ar
    from transformers import AttentionInterface

    from multispec.models import static

    monkeypatch.setenv("MULTISPEC_LEAN", "0")  # transformers' forward, whose attention calls are counted here; our
    model = _bf16_llama()  # one-call layers make the same claim in tests/models/hf/test_lean.py
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
