import itertools

import pytest
import torch

from multispec.warp import Sampling, argmax, largest


def test_greedy_is_one_hot_at_argmax():
    probs = Sampling(temperature=0).probs(torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]]))
    assert probs.tolist() == [[0, 1, 0], [1, 0, 0]]


def test_temperature_scales_logits():
    logits = torch.tensor([1.0, 2.0, 3.0])
    got = Sampling(temperature=2.0).probs(logits)
    assert torch.allclose(got, torch.softmax(logits / 2, -1))


def test_top_k_keeps_k_and_renormalises():
    logits = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3]))
    got = Sampling(top_k=2).probs(logits)
    assert torch.allclose(got, torch.tensor([0, 4 / 7, 0, 3 / 7]))


def test_top_p_keeps_the_crossing_token():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64))
    # 0.5 < 0.6, 0.8 crosses 0.6: keep {0, 1}
    got = Sampling(top_p=0.6).probs(logits)
    assert torch.allclose(got, torch.tensor([0.625, 0.375, 0, 0], dtype=torch.float64))
    # exactly at the threshold nothing more is needed
    got = Sampling(top_p=0.5).probs(logits)
    assert torch.allclose(got, torch.tensor([1.0, 0, 0, 0], dtype=torch.float64))


def test_top_k_then_top_p_on_batch_rows():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]]))
    got = Sampling(top_k=3, top_p=0.5).probs(logits)
    # after top-k 3 the masses are 4/9, 3/9, 2/9: 4/9 < 0.5, 7/9 crosses
    assert torch.allclose(got, torch.tensor([[4 / 7, 3 / 7, 0, 0], [0, 0, 3 / 7, 4 / 7]]))


def test_half_precision_logits_give_float32_probs():
    assert Sampling().probs(torch.zeros(5, dtype=torch.bfloat16)).dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
    ],
)
def test_bad_settings_name_the_value(kwargs, word):
    with pytest.raises(ValueError, match=word):
        Sampling(**kwargs)


def test_categorical_draws_follow_the_weights_and_never_a_zero_weight():
    from multispec.warp import categorical

    weights = torch.tensor([0.1, 0.0, 0.5, 0.15, 0.25, 0.0])
    g = torch.Generator().manual_seed(0)
    n = 200_000
    draws = categorical(weights.expand(n, -1), g)
    assert draws.shape == (n,)
    freq = torch.bincount(draws, minlength=6).double() / n
    assert freq[1] == 0 and freq[5] == 0
    sigma = (weights.double() * (1 - weights.double()) / n).sqrt()
    assert ((freq - weights.double()).abs() <= 5 * sigma + 1e-12).all(), freq
    # unnormalised weights, batch shape kept
    assert categorical(torch.tensor([[[0.0, 3.0]], [[2.0, 0.0]]]), g).tolist() == [[1], [0]]


def test_categorical_at_the_top_of_the_uniform_takes_the_last_positive_weight(monkeypatch):
    from multispec import warp

    top = 1 - 2.0**-53  # the largest float64 below 1: u * total may round up to the total
    monkeypatch.setattr(warp.torch, "rand", lambda *a, **k: torch.full((a[0], 1), top, dtype=torch.float64))
    assert warp.categorical(torch.tensor([0.3, 0.7, 0.0, 0.0])).item() == 1
    with pytest.raises(ValueError, match="finite"):
        warp.categorical(torch.tensor([0.5, float("nan")]))


def test_categorical_samples_are_iid_draws_per_row():
    from multispec.warp import categorical

    weights = torch.tensor([[0.2, 0.0, 0.8], [0.0, 3.0, 1.0]])  # unnormalised rows
    g = torch.Generator().manual_seed(1)
    n = 40_000
    draws = categorical(weights[:, None].expand(-1, n, -1), g, samples=2)  # [2, n, 2]
    assert draws.shape == (2, n, 2)
    law = weights.double() / weights.double().sum(-1, keepdim=True)
    for row in range(2):
        pairs = torch.bincount(draws[row, :, 0] * 3 + draws[row, :, 1], minlength=9).double() / n
        want = (law[row][:, None] * law[row][None, :]).flatten()  # independent draws: the product law
        sigma = (want * (1 - want) / n).sqrt()
        assert ((pairs - want).abs() <= 5 * sigma + 1e-12).all(), (row, pairs, want)


def test_draws_without_replacement_follow_the_sequential_law():
    from scipy.stats import chisquare

    from multispec.warp import draw_without_replacement

    w = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0], dtype=torch.float64)
    g = torch.Generator().manual_seed(2)
    n = 20_000
    counts = torch.zeros(5, 5, dtype=torch.float64)
    for _ in range(n):
        i, j = draw_without_replacement(w, 2, g).tolist()
        counts[i, j] += 1
    assert counts.diagonal().sum() == 0 and counts[4].sum() == 0 and counts[:, 4].sum() == 0
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j]
    observed = [counts[i, j].item() for i, j in pairs]
    # the first draw from w, the second from what is left: torch.multinomial(w, 2, replacement=False)'s law
    sequential = [n * w[i].item() * w[j].item() / (1 - w[i].item()) for i, j in pairs]
    assert chisquare(observed, sequential).pvalue > 1e-3
    # a plausible wrong law (independent draws, repeats rejected) fails the same test on the same draws
    product = [w[i].item() * w[j].item() for i, j in pairs]
    wrong = [n * p / sum(product) for p in product]
    assert chisquare(observed, wrong).pvalue < 1e-6
    with pytest.raises(ValueError, match="cannot draw 5 distinct indices from 4"):
        draw_without_replacement(w, 5, g)


def test_a_third_draw_without_replacement_skips_both_earlier_ones_by_their_weight():
    from scipy.stats import chisquare

    from multispec.warp import draw_without_replacement

    # the heaviest entries first, so a third draw's point usually has to step over both drawn entries
    w = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.1], dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    n = 30_000
    counts: dict[tuple[int, int, int], int] = {}
    for _ in range(n):
        key = tuple(draw_without_replacement(w, 3, g).tolist())
        counts[key] = counts.get(key, 0) + 1
    triples = [t for t in itertools.permutations(range(5), 3)]
    assert set(counts) <= set(triples)
    p = w.tolist()
    expected = [n * p[i] * p[j] / (1 - p[i]) * p[k] / (1 - p[i] - p[j]) for i, j, k in triples]
    assert chisquare([counts.get(t, 0) for t in triples], expected).pvalue > 1e-3


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_next_token_and_probs_and_token_draw_as_draw_of_probs(temperature):
    sampling = Sampling(temperature=temperature, top_k=5)
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(3))
    logits[1, 7] = logits[1, 30] = logits[1].max() + 1  # a tie: the first maximum is the greedy token
    want = sampling.draw(sampling.probs(logits), torch.Generator().manual_seed(4))
    assert torch.equal(sampling.next_token(logits, torch.Generator().manual_seed(4)), want)
    probs, token = sampling.probs_and_token(logits, torch.Generator().manual_seed(4))
    assert torch.equal(probs, sampling.probs(logits)) and torch.equal(token, want)
    assert temperature > 0 or want[1] == 7
    assert torch.equal(sampling.probs_and_token(logits.half())[0], sampling.probs(logits.half()))


def test_argmax_is_torchs_argmax_on_ties_nans_infinities_and_views():
    # the greedy token on a CPU comes from numpy's vectorised argmax: the same first maximum as torch's, a NaN
    # counted as the maximum, for strided views (logits cut to the vocabulary), single rows and other dtypes
    g = torch.Generator().manual_seed(5)
    rows = torch.randn(6, 40, generator=g, dtype=torch.float64)
    rows[0, 3] = rows[0, 20] = rows[0].max() + 1  # a tie
    rows[1, 11] = float("nan")
    rows[1, 30] = float("inf")
    rows[2] = float("-inf")  # every entry -inf: index 0
    rows[3, 5] = float("inf")
    rows[3, 9] = float("inf")
    for t in (
        rows,
        rows.float(),
        rows[:, :33],
        rows.float()[:, :33].T.contiguous().T,
        rows[2:, 1:],
        rows.half(),
        rows.bfloat16(),
        rows[0],
        rows.float()[4],
    ):
        with torch.inference_mode():
            got = argmax(t)
        assert got.dtype == torch.long and torch.equal(got, t.argmax(-1)), t.dtype
    assert argmax(rows[:, :33]).tolist()[:4] == [3, 11, 0, 5]


def test_largest_is_torchs_topk_and_puts_tied_lower_indices_first():
    g = torch.Generator().manual_seed(6)
    rows = torch.randn(5, 50, generator=g, dtype=torch.float64)
    for t in (rows, rows.float(), rows[:, :37], rows[1], rows.float().reshape(5, 2, 25)):
        for k in (1, 2, 3, 8):
            values, indices = largest(t, k)
            want = torch.topk(t, k)
            assert torch.equal(values, want.values) and torch.equal(indices, want.indices), (t.shape, k)
    ties = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0, -1.0], [float("nan"), 0.0, 3.0, 3.0, float("nan"), 1.0]])
    values, indices = largest(ties, 3)
    assert indices.tolist() == [[1, 3, 4], [0, 4, 2]]
    assert values[0].tolist() == [2.0, 2.0, 2.0] and values[1].isnan().tolist() == [True, True, False]
    # -inf ties too: the lower index first; a row with fewer than k entries that repeated passes tell apart (an
    # index would come back twice) goes to torch's topk
    short = torch.tensor([[float("-inf"), 1.0, float("-inf"), 0.5], [1.0, 2.0, 3.0, 4.0]])
    assert largest(short, 3)[1].tolist() == [[1, 3, 0], [3, 2, 1]]
    shorter = torch.tensor([[float("-inf"), 1.0, float("-inf"), float("-inf")]])
    got, want = largest(shorter, 3), torch.topk(shorter, 3)
    assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)
    assert len(set(got[1][0].tolist())) == 3
    assert largest(rows.half(), 2)[1].tolist() == torch.topk(rows.half(), 2).indices.tolist()


def test_draws_without_replacement_from_few_rows_are_made_in_numpy_with_the_same_tokens_as_in_torch(monkeypatch):
    from multispec import warp

    gen = torch.Generator().manual_seed(3)
    weights = torch.rand(3, 1000, generator=gen) * (torch.rand(3, 1000, generator=gen) > 0.5)  # zeros among them
    weights[1, :996] = 0  # a row of at most 4 tokens: draws without replacement run past it

    def draws(numpy_rows: int):
        monkeypatch.setattr(warp, "NUMPY_ROWS", numpy_rows)
        g = torch.Generator().manual_seed(7)
        return (
            *warp.sequential_draws(weights, 8, g),
            *warp.sequential_draws(weights.double()[:1], 3, g),
            warp.categorical(weights[0], g),
        )  # the generator's state after them: the same uniforms taken

    for ours, theirs in zip(draws(8), draws(0), strict=True):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_draws_by_rows_are_the_draws_over_the_flattened_weights(dtype):
    # mass[b] * rows[b, v] flattened, drawn without replacement: the same indices from the same uniforms, and the
    # generator left where the flat draws leave it; zeros in the rows, a row of no mass, a row of few tokens
    from multispec import warp

    gen = torch.Generator().manual_seed(11)
    for trial in range(40):
        n, vocab = 1 + trial % 6, 50 + 37 * (trial % 4)
        rows = torch.rand(n, vocab, generator=gen, dtype=dtype) ** 4 * (torch.rand(n, vocab, generator=gen) > 0.3)
        rows = rows / rows.sum(-1, keepdim=True)
        mass = torch.softmax(3 * torch.randn(n, generator=gen, dtype=torch.float64), -1).to(dtype)
        if n > 2:
            mass[1] = 0
            rows[2, 3:] = 0
            rows[2, :3] = 1 / 3
        flat = (rows * mass[:, None]).reshape(1, -1)
        k = min(8, int(torch.count_nonzero(flat)))
        ours = warp.draws_by_rows(rows, mass, k, torch.Generator().manual_seed(trial))
        g = torch.Generator().manual_seed(trial)
        theirs = warp.sequential_draws(flat, k, g)[0][0]
        assert ours.tolist() == theirs.tolist()
        assert all(mass[i // vocab] > 0 and rows[i // vocab, i % vocab] > 0 for i in ours.tolist())
    with pytest.raises(ValueError, match="sum to zero"):
        warp.draws_by_rows(torch.ones(2, 3), torch.zeros(2), 1)


def test_draws_by_rows_follow_the_law_of_draws_without_replacement():
    from scipy.stats import chisquare

    from multispec.warp import draws_by_rows

    rows = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.0, 0.9]], dtype=torch.float64)
    mass = torch.tensor([0.6, 0.4], dtype=torch.float64)
    w = (rows * mass[:, None]).reshape(-1).tolist()
    pairs = [(i, j) for i in range(6) for j in range(6) if i != j and w[i] > 0 and w[j] > 0]
    exact = [w[i] * w[j] / (1 - w[i]) for i, j in pairs]

    def pvalue(draw) -> float:
        g = torch.Generator().manual_seed(2)
        n = 20_000
        counts: dict[tuple[int, int], int] = {}
        for _ in range(n):
            key = tuple(draw(rows, mass, 2, g).tolist())
            counts[key] = counts.get(key, 0) + 1
        assert set(counts) <= set(pairs)
        return chisquare([counts.get(t, 0) for t in pairs], [n * x for x in exact]).pvalue

    def row_by_its_first_share(rows, mass, k, g):
        # known-wrong: each draw picks its row by the row's whole share, not by the weight the row has left
        picks = []
        for _ in range(k):
            b = int(torch.multinomial(mass, 1, generator=g))
            left = rows[b].clone()
            left[[p % 3 for p in picks if p // 3 == b]] = 0
            picks.append(3 * b + int(torch.multinomial(left, 1, generator=g)))
        return torch.tensor(picks)

    assert pvalue(draws_by_rows) > 1e-3
    assert pvalue(row_by_its_first_share) < 1e-6


@pytest.mark.parametrize("sampling", [Sampling(1.0), Sampling(0.7, top_k=50), Sampling(0.9, top_p=0.8), Sampling(0.0)])
def test_rows_made_one_by_one_equal_the_batched_rows(sampling):
    logits = torch.randn(5, 4099, generator=torch.Generator().manual_seed(0)) * 4
    rows, batched = sampling.rows(logits), sampling.probs(logits)
    assert len(rows) == 5
    assert all(torch.equal(rows[i], batched[i]) for i in (3, 0, 4, 1, 2))
    assert torch.equal(rows.stacked(), batched)
