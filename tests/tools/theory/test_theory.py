"""Seed 002 §6.3: the theory calculators, and the real decoders against them."""

import numpy as np
import pytest
from scipy.optimize import linprog

from multispec.tools.theory import calculators as calc
from multispec.tools.theory.simulate import first_token_law, rejections_per_run

# Instance A (the theory spec §6.3, test 4); the spec's p is the draft and q the target.
A_DRAFT, A_TARGET = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])


def instance_b():
    """Instance B (test 5): V = {0, 1}, x0 = 0, T = 2; stationary draft (0.5, 0.5);
    target (0.8, 0.2) after 0 and (0.5, 0.5) after 1."""
    draft = np.full((2, 2, 2), 0.5)
    target = np.array([[[0.8, 0.2], [0.5, 0.5]]] * 2)
    return draft, target, np.array([1.0, 0.0])


def random_pair(seed, horizon=6, vocab=4):
    rng = np.random.default_rng(seed)
    return calc.uniform_rows(rng, horizon, vocab), calc.uniform_rows(rng, horizon, vocab)


# ---- A. primitives ---------------------------------------------------------------------------------


def test_tv_identities():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a, b = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        assert calc.tv(a, b) == pytest.approx(0.5 * np.abs(a - b).sum(), abs=1e-12)
        assert calc.tv(a, b) == pytest.approx(1 - np.minimum(a, b).sum(), abs=1e-12)
    assert calc.tv(a, a) == 0 and calc.tv(np.array([1.0, 0]), np.array([0, 1.0])) == 1


def test_sd_one_step_law_is_the_target():
    rng = np.random.default_rng(1)
    for _ in range(50):
        d, t = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
        residual = np.clip(t - d, 0, None) / np.clip(t - d, 0, None).sum()
        assert np.allclose(np.minimum(d, t) + calc.tv(d, t) * residual, t, atol=1e-12)


def test_batch_first_token_law_and_monotone_rho():
    rng = np.random.default_rng(2)
    for _ in range(30):
        d, t = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        rhos = []
        for m in range(1, 7):
            # telescoping identity: sum_m min(R_{m-1} d, r^m) + r^{M+1} = target
            r, big_r, acc = t.copy(), 1.0, np.zeros(5)
            for _ in range(m):
                acc += np.minimum(big_r * d, r)
                r = np.clip(r - big_r * d, 0, None)
                big_r = r.sum()
            rho, g = calc.batch_first_token(d, t, m)
            assert np.allclose(acc + g, t, atol=1e-12) and rho == pytest.approx(big_r)
            rhos.append(rho)
        assert rhos[0] == pytest.approx(calc.tv(d, t))
        assert all(x >= y - 1e-15 for x, y in zip(rhos, rhos[1:], strict=False))


def test_instance_a_closed_forms():
    assert calc.tv(A_DRAFT, A_TARGET) == pytest.approx(0.3)
    rho = [calc.batch_first_token(A_DRAFT, A_TARGET, m)[0] for m in (1, 2, 3)]
    assert rho == pytest.approx([0.3, 0.24, 0.192])
    b = calc.relaxed_acceptance(A_DRAFT, A_TARGET, 0.1)
    assert b == pytest.approx([0.6, 1, 1])
    assert calc.rejection(b, A_DRAFT) == pytest.approx(0.2)
    assert calc.loss_star(b, A_DRAFT, A_TARGET) == pytest.approx(0.1)
    assert calc.optimal_resampling(b, A_DRAFT, A_TARGET) == pytest.approx([0, 0, 1])
    law_opt = b * A_DRAFT + 0.2 * calc.optimal_resampling(b, A_DRAFT, A_TARGET)
    law_uno = b * A_DRAFT + 0.2 * A_TARGET
    assert law_opt == pytest.approx([0.3, 0.3, 0.4]) and law_uno == pytest.approx([0.34, 0.36, 0.30])
    assert calc.loss_of(b, A_TARGET, A_DRAFT, A_TARGET) == pytest.approx(0.2)


def test_bernoulli_and_uniform_closed_forms():
    d, t = np.array([0.7, 0.3]), np.array([0.3, 0.7])
    for m in range(1, 6):
        assert calc.batch_first_token(d, t, m)[0] == pytest.approx(0.4 * 0.7 ** (m - 1))
    n, k = 10, 4
    wide, narrow = np.full(n, 0.1), np.r_[np.full(k, 0.25), np.zeros(n - k)]
    for m in range(1, 6):
        assert calc.batch_first_token(wide, narrow, m)[0] == pytest.approx(0.6**m)  # target inside draft's support
        assert calc.batch_first_token(narrow, wide, m)[0] == pytest.approx(0.6)  # no improvement at all


# ---- B. Theorem 1 ----------------------------------------------------------------------------------


def test_instance_b_sd_value():
    draft, target, mu0 = instance_b()
    assert calc.sd_rejections(draft, target, mu0).total == pytest.approx(0.54)


def test_sd_simulation_matches_theorem_1():
    draft, target = random_pair(3, horizon=8, vocab=5)
    exact = calc.sd_rejections(draft, target)
    sim = rejections_per_run(draft, target, runs=3000, method="sd", seed=1)
    se = sim.std(ddof=1) / np.sqrt(len(sim))
    assert abs(sim.mean() - exact.total) <= 4 * se + 1e-9, (sim.mean(), exact.total, se)


def test_degenerate_instances():
    draft, _ = random_pair(4)
    assert calc.sd_rejections(draft, draft).total == 0
    sim = rejections_per_run(draft, draft, runs=50, method="sd")
    assert (sim == 0).all()
    # disjoint supports: every token is a rejection
    d = np.zeros((4, 4, 4))
    d[..., :2] = 0.5
    t = np.zeros((4, 4, 4))
    t[..., 2:] = 0.5
    assert calc.sd_rejections(d, t).total == pytest.approx(4)
    assert (rejections_per_run(d, t, runs=20, method="sd") == 4).all()


def test_expected_calls_relation():
    draft, target = random_pair(5)
    r = calc.sd_rejections(draft, target)
    assert r.expected_calls == pytest.approx(1 + r.total - r.per_position[-1])
    assert r.expected_calls <= draft.shape[0]


# ---- C. Theorem 2 (optimality within unbiased template algorithms) ---------------------------------


@pytest.mark.parametrize("c", [0.3, 0.7, 1.0])
def test_scaled_down_acceptance_is_unbiased_and_rejects_more(c):
    rng = np.random.default_rng(6)
    for _ in range(20):
        d, t = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        b = c * np.minimum(1, t / d)
        resampling = calc.optimal_resampling(b, d, t)
        assert calc.loss_of(b, resampling, d, t) == pytest.approx(0, abs=1e-12)
        assert calc.rejection(b, d) >= calc.tv(d, t) - 1e-12
        assert (calc.rejection(b, d) == pytest.approx(calc.tv(d, t))) == (c == 1.0)


def test_over_acceptance_is_biased_for_every_resampling():
    rng = np.random.default_rng(7)
    d, t = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    b = np.minimum(1, t / d)
    x = int(np.argmax(d - t))  # a token where the draft over-proposes, so b(x) < 1
    b[x] = min(1.0, b[x] + 0.2)
    for _ in range(20):
        assert calc.loss_of(b, rng.dirichlet(np.ones(5)), d, t) >= np.clip(b * d - t, 0, None).sum() - 1e-12 > 0


# ---- D. Theorem 3 and Proposition 1 ----------------------------------------------------------------


def test_instance_b_batch_values():
    draft, target, mu0 = instance_b()
    for m, expected in [(1, 0.54), (2, 0.3675), (3, 0.298125), (5, 0.2534765625)]:
        rho = 0.3 * 0.5 ** (m - 1)
        assert 0.24 + rho * (0.7 + rho) == pytest.approx(expected)
        assert calc.batch_rejections(draft, target, m, mu0).total == pytest.approx(expected, abs=1e-12)
    assert calc.batch_rejections(draft, target, np.inf, mu0).total == pytest.approx(0.24)


def test_batch_of_one_is_sd_exactly():
    draft, target = random_pair(8)
    assert calc.batch_rejections(draft, target, 1).total == calc.sd_rejections(draft, target).total


def test_batch_rejections_never_increase_with_m_and_converge():
    draft, target = random_pair(9, horizon=10, vocab=5)
    values = [calc.batch_rejections(draft, target, m).total for m in range(1, 40)]
    assert all(b <= a + 1e-12 for a, b in zip(values, values[1:], strict=False))
    limit = calc.batch_rejections(draft, target, np.inf).total
    assert abs(calc.batch_rejections(draft, target, 2000).total - limit) < 1e-2
    mu1 = np.full(5, 0.2) @ target[0]
    assert limit >= mu1 @ calc.tv(draft[1], target[1]) > 0
    assert calc.batch_rejections(draft[:1], target[:1], np.inf).total == pytest.approx(0)  # T = 1


@pytest.mark.slow
@pytest.mark.parametrize("m", [2, 4])
def test_batch_sd_simulation_matches_theorem_3(m):
    draft, target = random_pair(10, horizon=8, vocab=5)
    exact = calc.batch_rejections(draft, target, m)
    sim = rejections_per_run(draft, target, runs=2500, method="batch-sd", seed=2, drafts=m)
    se = sim.std(ddof=1) / np.sqrt(len(sim))
    assert abs(sim.mean() - exact.total) <= 4 * se + 1e-9, (sim.mean(), exact.total, se)
    assert exact.total < calc.sd_rejections(draft, target).total


# ---- E. Theorems 4 and 5 ---------------------------------------------------------------------------


def lp_loss(b, d, t):
    """min over resampling P of TV(b d + r P, t), as a linear programme over (P, slack)."""
    v, r = len(d), calc.rejection(b, d)
    base = b * d
    # variables: P (v), s (v) with s >= +/-(base + r P - t); minimise 0.5 sum s
    c = np.r_[np.zeros(v), 0.5 * np.ones(v)]
    eye = np.eye(v)
    a_ub = np.block([[r * eye, -eye], [-r * eye, -eye]])
    b_ub = np.r_[t - base, base - t]
    a_eq = np.r_[np.ones(v), np.zeros(v)][None]
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[1], bounds=[(0, None)] * (2 * v))
    return res.fun


def test_loss_star_equals_the_lp_optimum():
    rng = np.random.default_rng(11)
    for _ in range(40):
        d, t = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        b = rng.uniform(size=5)
        assert calc.loss_star(b, d, t) == pytest.approx(lp_loss(b, d, t), abs=1e-7)
        assert calc.loss_of(b, calc.optimal_resampling(b, d, t), d, t) == pytest.approx(calc.loss_star(b, d, t))


def test_pareto_front():
    rng = np.random.default_rng(12)
    for _ in range(100):
        d, t = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        b = rng.uniform(size=5)
        on_front = bool(np.all(b >= np.minimum(1, t / d) - 1e-12))
        total = calc.rejection(b, d) + calc.loss_star(b, d, t)
        assert total >= calc.tv(d, t) - 1e-12
        assert (total == pytest.approx(calc.tv(d, t))) == on_front
        eps = rng.uniform(0, 0.3)
        be = calc.relaxed_acceptance(d, t, eps)
        assert calc.rejection(be, d) == pytest.approx(np.clip(d - t - eps, 0, None).sum())
        assert calc.loss_star(be, d, t) == pytest.approx(np.minimum(np.clip(d - t, 0, None), eps).sum())
        assert calc.rejection(be, d) + calc.loss_star(be, d, t) == pytest.approx(calc.tv(d, t))
        assert calc.loss_of(be, t, d, t) >= calc.loss_star(be, d, t) - 1e-12  # UNO is never better than OPT
        assert calc.optimal_resampling(be, d, t) == pytest.approx(np.clip(t - d, 0, None) / calc.tv(d, t))


@pytest.mark.parametrize("mode", ["opt", "uno"])
def test_sd_opt_measured_law_and_rejection(mode):
    d, t = np.array([0.5, 0.25, 0.15, 0.1]), np.array([0.1, 0.3, 0.2, 0.4])
    eps = 0.1
    law, rej = first_token_law(d, t, runs=6000, method="sd-opt", seed=3, eps=eps, resample=mode)
    b = calc.relaxed_acceptance(d, t, eps)
    resampling = calc.optimal_resampling(b, d, t) if mode == "opt" else t
    exact = b * d + calc.rejection(b, d) * resampling
    assert np.abs(law - exact).max() < 0.02
    assert abs(rej - calc.rejection(b, d)) < 0.02
    bias = calc.tv(law, t)
    front = calc.tv(d, t) - rej
    assert (abs(bias - front) < 0.03) if mode == "opt" else (bias > front + 0.03)


def test_sd_opt_with_zero_eps_is_sd_draw_for_draw():
    from multispec import generate
    from multispec.models.markov import random_markov_pair

    target, draft = random_markov_pair(6, 40, seed=13)
    for seed in range(5):
        a = generate(target, draft, [1], method="sd", gamma=3, max_new_tokens=30, seed=seed).token_ids
        b = generate(target, draft, [1], method="sd-opt", eps=0.0, gamma=3, max_new_tokens=30, seed=seed).token_ids
        assert a == b


@pytest.mark.slow
def test_finite_lookahead_and_bonus():
    """Test 8: finite K without bonus keeps E[N_rej]; the bonus lowers it; calls = 1 + N_rej - R_T."""
    draft, target = random_pair(14, horizon=8, vocab=4)
    exact = calc.sd_rejections(draft, target).total
    no_bonus = rejections_per_run(draft, target, runs=2500, method="sd", seed=4, gamma=3)
    se = no_bonus.std(ddof=1) / np.sqrt(len(no_bonus))
    assert abs(no_bonus.mean() - exact) <= 4 * se
    with_bonus = rejections_per_run(draft, target, runs=2500, method="sd", seed=5, gamma=3, bonus=True)
    assert with_bonus.mean() < exact - 2 * se

    from multispec import MarkovLM, generate

    t_lm, d_lm = MarkovLM(target), MarkovLM(draft)
    for seed in range(200):
        st = generate(t_lm, d_lm, [seed % 4], method="sd", gamma=8, bonus=False, max_new_tokens=8, seed=seed).stats
        assert st["target_calls"] - 1 - st["rejections"] in (0, -1) and st["target_calls"] <= 8


def test_pointwise_scaled_acceptance_is_unbiased_with_more_rejections():
    """Test 10 with a random pointwise factor c(x) in [0, 1]."""
    rng = np.random.default_rng(15)
    for _ in range(30):
        d, t = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        b = rng.uniform(size=5) * np.minimum(1, t / d)
        assert calc.loss_of(b, calc.optimal_resampling(b, d, t), d, t) == pytest.approx(0, abs=1e-12)
        assert calc.rejection(b, d) >= calc.tv(d, t) - 1e-12
