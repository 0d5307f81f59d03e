"""Adaptive batch statistics (ALGORITHM.md §2) against brute force from explicit gradient-sample vectors.

Every statistic that :func:`adloco.library.algorithms.batching.pool` computes from per-worker scalars is checked
against the same quantity written out from the P-vectors g_j, and the targets T against ALGORITHM.md's
formulas. A Monte Carlo test on a problem with known per-example variance checks that the pooled
estimators are unbiased.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from adloco.library.algorithms import batching
from adloco.library.algorithms.batching import (
    Rule,
    TrainerStats,
    WorkerStats,
    needs_shared_mean,
    pool,
    probe_layout,
)

RTOL = 1e-9
ETA, VARTHETA, NU = 0.8, 0.01, 0.3


def _samples(ks: tuple[int, ...], p: int, seed: int) -> list[np.ndarray]:
    """One (k_m, P) array of gradient samples per worker, with a clear common mean."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=p) * 2.0
    return [mu + rng.normal(size=(k, p)) for k in ks]


def _worker_stats(g: np.ndarray, c: int, gbar: np.ndarray | None = None) -> WorkerStats:
    """The scalars one worker sends (computed here from its own sample vectors)."""
    gm = g.mean(axis=0)
    kw = dict(n=g.shape[0], c=c, sum_sq=float((g * g).sum()), mean_sq=float(gm @ gm))
    if gbar is not None:
        p = g @ gbar
        kw.update(sum_p=float(p.sum()), sum_p2=float((p * p).sum()))
    return WorkerStats(**kw)


# ---------------------------------------------------------------------------------------------------
# 1. shared mean: exact statistics
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def shared() -> dict:
    ks, p, c = (2, 3, 4), 7, 3
    groups = _samples(ks, p, seed=11)
    allg = np.concatenate(groups)
    n = allg.shape[0]
    gbar = allg.mean(axis=0)
    gbar_sq = float(gbar @ gbar)
    # brute force, straight from the definitions in ALGORITHM.md §2
    sigma2 = c * sum(float((gj - gbar) @ (gj - gbar)) for gj in allg) / (n - 1)
    pj = np.array([float(gj @ gbar) for gj in allg])
    var_p = float(np.var(pj, ddof=1))
    orth = 0.0
    for gj, p_ in zip(allg, pj, strict=True):
        perp = gj - (p_ / gbar_sq) * gbar
        orth += float(perp @ perp)
    stats = [_worker_stats(g, c, gbar) for g in groups]
    return dict(stats=stats, n=n, c=c, M=len(ks), gbar_sq=gbar_sq, sigma2=sigma2, var_p=var_p, orth=orth)


def test_pool_shared_mean_matches_brute_force(shared: dict) -> None:
    st = pool(shared["stats"], gbar_sq=shared["gbar_sq"])
    assert st is not None
    assert st.exact
    assert (st.n, st.c, st.workers) == (shared["n"], shared["c"], shared["M"])
    assert st.gbar_sq == shared["gbar_sq"]
    np.testing.assert_allclose(st.sigma2, shared["sigma2"], rtol=RTOL)
    np.testing.assert_allclose(st.var_p, shared["var_p"], rtol=RTOL)
    np.testing.assert_allclose(st.orth_sq, shared["orth"], rtol=RTOL)


def test_targets_match_spec_formulas(shared: dict) -> None:
    st = pool(shared["stats"], gbar_sq=shared["gbar_sq"])
    assert st is not None
    M, n, c, g2 = shared["M"], shared["n"], shared["c"], shared["gbar_sq"]
    t_norm = shared["sigma2"] / (M * ETA**2 * g2)
    t_ip = c * shared["var_p"] / (M * VARTHETA**2 * g2**2)
    t_orth = c * shared["orth"] / ((n - 1) * M * NU**2 * g2)
    np.testing.assert_allclose(Rule("norm", ETA, VARTHETA, NU).target(st), t_norm, rtol=RTOL)
    np.testing.assert_allclose(Rule("inner_product", ETA, VARTHETA, NU).target(st), t_ip, rtol=RTOL)
    np.testing.assert_allclose(
        Rule("augmented_inner_product", ETA, VARTHETA, NU).target(st), max(t_ip, t_orth), rtol=RTOL
    )
    # make the max meaningful: with a large ϑ the orthogonality term is the one that wins
    t_ip_big = c * shared["var_p"] / (M * 10.0**2 * g2**2)
    assert t_orth > t_ip_big
    np.testing.assert_allclose(Rule("augmented_inner_product", ETA, 10.0, NU).target(st), t_orth, rtol=RTOL)
    with pytest.raises(ValueError):
        Rule("bogus", ETA, VARTHETA, NU).target(st)


def test_pool_shared_mean_without_inner_products_gives_nan_for_ip_stats(shared: dict) -> None:
    stats = [WorkerStats(s.n, s.c, s.sum_sq, s.mean_sq) for s in shared["stats"]]
    st = pool(stats, gbar_sq=shared["gbar_sq"])
    assert st is not None
    np.testing.assert_allclose(st.sigma2, shared["sigma2"], rtol=RTOL)
    assert math.isnan(st.var_p) and math.isnan(st.orth_sq)
    assert math.isnan(Rule("inner_product", ETA, VARTHETA, NU).target(st))


def test_pool_edge_cases() -> None:
    assert pool([]) is None
    assert pool([WorkerStats(1, 2, 1.0, 1.0)], gbar_sq=1.0) is None  # n < 2
    assert pool([WorkerStats(1, 2, 1.0, 1.0), WorkerStats(1, 2, 2.0, 2.0)]) is None  # n - M < 1
    with pytest.raises(ValueError):
        pool([WorkerStats(2, 2, 1.0, 1.0), WorkerStats(2, 3, 1.0, 1.0)])


# ---------------------------------------------------------------------------------------------------
# 2. scalars only
# ---------------------------------------------------------------------------------------------------


def test_pool_scalars_only_within_worker_variance() -> None:
    ks, p, c = (2, 3, 5), 7, 4
    groups = _samples(ks, p, seed=5)
    n, M = sum(ks), len(ks)
    within = sum(float(((g - g.mean(axis=0)) ** 2).sum()) for g in groups)
    sigma2 = c * within / (n - M)
    st = pool([_worker_stats(g, c) for g in groups])
    assert st is not None and not st.exact
    assert (st.n, st.c, st.workers) == (n, c, M)
    np.testing.assert_allclose(st.sigma2, sigma2, rtol=RTOL)
    # ‖ḡ‖² estimate: mean_m(‖ḡ_m‖² − σ̂²/(k_m c)) + σ̂²/(n c), from the vectors
    grad_sq = np.mean([float(g.mean(0) @ g.mean(0)) - sigma2 / (g.shape[0] * c) for g in groups])
    assert grad_sq > 0
    np.testing.assert_allclose(st.gbar_sq, grad_sq + sigma2 / (n * c), rtol=RTOL)
    assert math.isnan(st.var_p) and math.isnan(st.orth_sq)
    np.testing.assert_allclose(
        Rule("norm", ETA, VARTHETA, NU).target(st), sigma2 / (M * ETA**2 * st.gbar_sq), rtol=RTOL
    )


def test_pool_scalars_only_one_worker_is_exact() -> None:
    (g,) = _samples((6,), 7, seed=3)
    c = 2
    gbar = g.mean(axis=0)
    st = pool([_worker_stats(g, c)])
    assert st is not None
    assert float(gbar @ gbar) >= st.sigma2 / (6 * c)  # the clip is inactive
    np.testing.assert_allclose(st.gbar_sq, float(gbar @ gbar), rtol=1e-12)
    # with one worker both paths give the same σ̂²
    shared_st = pool([_worker_stats(g, c)], gbar_sq=float(gbar @ gbar))
    assert shared_st is not None
    np.testing.assert_allclose(st.sigma2, shared_st.sigma2, rtol=RTOL)


def test_pool_scalars_only_clips_gradient_norm_at_zero() -> None:
    rng = np.random.default_rng(0)
    g = rng.normal(size=(4, 7))  # zero-mean: ‖ḡ‖² < σ̂²/(k c) here
    c = 3
    gbar = g.mean(axis=0)
    st = pool([_worker_stats(g, c)])
    assert st is not None
    assert float(gbar @ gbar) < st.sigma2 / (4 * c)
    np.testing.assert_allclose(st.gbar_sq, st.sigma2 / (4 * c), rtol=RTOL)


# ---------------------------------------------------------------------------------------------------
# 3. unbiasedness on a problem with known variance
# ---------------------------------------------------------------------------------------------------
# Per-example gradients x_i = μ + ε_i, ε_i ~ N(0, diag(s²)): σ² = Σ s² and ‖∇F‖² = ‖μ‖² exactly.
# This checks the POOLED estimator (all samples at one common point). The `paper` estimator (the last
# inner-step gradient of each worker, after the workers drifted apart) is biased upward by design and is
# not what is tested here.

TRIALS = 20000
S2 = np.array([1.0, 0.5, 2.0, 0.25, 1.25])
SIGMA2 = float(S2.sum())
KS = (2, 3, 4)  # chunks per worker (different on purpose)
C = 2  # examples per chunk


@pytest.fixture(scope="module")
def trials() -> dict:
    rng = np.random.default_rng(1234)
    mu = np.array([3.0, -2.0, 1.5, 2.5, -3.0])
    out: dict = dict(mu_sq=float(mu @ mu), sum_sq=[], mean_sq=[], ks=KS)
    for k in KS:
        x = mu + rng.normal(size=(TRIALS, k, C, S2.size)) * np.sqrt(S2)
        g = x.mean(axis=2)  # (trials, k, P) chunk gradients
        out["sum_sq"].append((g * g).sum(axis=(1, 2)))
        gm = g.mean(axis=1)
        out["mean_sq"].append((gm * gm).sum(axis=1))
        out.setdefault("sum_all", 0.0)
        out["sum_all"] = out["sum_all"] + g.sum(axis=1)
    n = sum(KS)
    gbar = out["sum_all"] / n
    out["gbar_sq"] = (gbar * gbar).sum(axis=1)
    return out


def _pool_each(tr: dict, shared_mean: bool) -> tuple[np.ndarray, np.ndarray]:
    sig, gsq = np.empty(TRIALS), np.empty(TRIALS)
    for i in range(TRIALS):
        stats = [
            WorkerStats(k, C, float(tr["sum_sq"][m][i]), float(tr["mean_sq"][m][i]))
            for m, k in enumerate(tr["ks"])
        ]
        st = pool(stats, gbar_sq=float(tr["gbar_sq"][i]) if shared_mean else None)
        assert st is not None
        sig[i], gsq[i] = st.sigma2, st.gbar_sq
    return sig, gsq


def _within_se(values: np.ndarray, expected: float, n_se: float = 4.0) -> None:
    se = values.std(ddof=1) / math.sqrt(values.size)
    assert abs(values.mean() - expected) < n_se * se, (values.mean(), expected, se)


def test_pooled_sigma2_unbiased_scalars_only(trials: dict) -> None:
    sig, gsq = _pool_each(trials, shared_mean=False)
    _within_se(sig, SIGMA2)
    # power check: the wrong denominator (n − 1 instead of n − M) is detectably biased
    n, M = sum(KS), len(KS)
    wrong = sig * (n - M) / (n - 1)
    se = sig.std(ddof=1) / math.sqrt(TRIALS)
    assert abs(wrong.mean() - SIGMA2) > 10 * se
    # ‖ḡ‖² estimate: unbiased for ‖∇F‖² + σ²/(n c) while the clip at zero is inactive
    within = sum(trials["sum_sq"][m] - k * trials["mean_sq"][m] for m, k in enumerate(KS))
    s_hat = C * within / (n - M)
    raw = np.mean([trials["mean_sq"][m] - s_hat / (k * C) for m, k in enumerate(KS)], axis=0)
    assert (raw > 0).all()  # clip inactive in every trial
    expected = trials["mu_sq"] + SIGMA2 / (n * C)
    _within_se(gsq, expected)
    se_g = gsq.std(ddof=1) / math.sqrt(TRIALS)
    assert abs(gsq.mean() - trials["mu_sq"]) > 5 * se_g  # the σ²/(n c) term is really there


def test_pooled_sigma2_unbiased_shared_mean(trials: dict) -> None:
    sig, gsq = _pool_each(trials, shared_mean=True)
    _within_se(sig, SIGMA2)
    n = sum(KS)
    np.testing.assert_array_equal(gsq, trials["gbar_sq"])
    _within_se(gsq, trials["mu_sq"] + SIGMA2 / (n * C))


# ---------------------------------------------------------------------------------------------------
# 4. decide
# ---------------------------------------------------------------------------------------------------


def _st(sigma2: float, gbar_sq: float = 1.0, workers: int = 1) -> TrainerStats:
    """Statistics whose norm-test target is exactly sigma2 (M = 1, η = 1, ‖ḡ‖² = 1)."""
    return TrainerStats(
        n=8,
        c=1,
        workers=workers,
        sigma2=sigma2,
        gbar_sq=gbar_sq,
        var_p=math.nan,
        orth_sq=math.nan,
        exact=False,
    )


def _decide(b: int, st: TrainerStats | None, test: str = "norm", cap: int = 1000):
    return Rule(test, 1.0, VARTHETA, NU).decide(b, st, cap=cap)


def test_decide_ceil_and_grow() -> None:
    d = _decide(2, _st(4.2))
    assert (d.request, d.reason) == (5, "grew")
    assert d.target == pytest.approx(4.2)
    d = _decide(2, _st(5.0))
    assert (d.request, d.reason) == (5, "grew")  # ceil, not floor + 1


def test_decide_never_shrinks() -> None:
    d = _decide(16, _st(3.0))
    assert (d.request, d.reason) == (16, "kept")
    d = _decide(16, _st(16.0))
    assert (d.request, d.reason) == (16, "kept")


def test_decide_respects_cap() -> None:
    d = _decide(4, _st(100.5), cap=64)
    assert (d.request, d.reason) == (64, "capped")
    d = _decide(64, _st(1e9), cap=64)
    assert (d.request, d.reason) == (64, "capped")
    d = _decide(4, _st(64.5), cap=64)  # ceil(T) = 65 would pass the cap
    assert (d.request, d.reason) == (64, "capped")
    d = _decide(4, _st(63.5), cap=64)
    assert (d.request, d.reason) == (64, "grew")
    rng = np.random.default_rng(0)
    for t in rng.uniform(0.0, 200.0, size=500):
        b = int(rng.integers(1, 65))
        d = _decide(b, _st(float(t)), cap=64)
        assert d.request == min(64, max(b, math.ceil(t)))
        assert b <= d.request <= 64


def test_decide_off_and_missing() -> None:
    d = _decide(7, _st(100.0), test="none")
    assert (d.request, d.reason) == (7, "off")
    d = _decide(7, None)
    assert (d.request, d.reason) == (7, "no-statistics")


@pytest.mark.parametrize("gbar_sq", [0.0, math.nan, math.inf, -1.0])
@pytest.mark.parametrize("test", ["norm", "inner_product", "augmented_inner_product"])
def test_decide_degenerate_gradient(gbar_sq: float, test: str) -> None:
    d = _decide(7, _st(3.0, gbar_sq=gbar_sq), test=test)
    assert (d.request, d.reason) == (7, "degenerate")


def test_decide_degenerate_nan_variance_or_target() -> None:
    assert _decide(7, _st(math.nan)).reason == "degenerate"
    # inner-product test on scalars-only statistics: var_p is nan -> T is nan -> no update
    d = _decide(7, _st(30.0), test="inner_product")
    assert (d.request, d.reason) == (7, "degenerate")


def test_decide_uses_pooled_target_end_to_end() -> None:
    (g,) = _samples((6,), 7, seed=9)
    st = pool([_worker_stats(g, 4)])
    assert st is not None
    t = st.sigma2 / (ETA**2 * st.gbar_sq)
    d = Rule("norm", ETA, VARTHETA, NU).decide(1, st, cap=10**6)
    assert d.request == max(1, math.ceil(t))
    np.testing.assert_allclose(d.target, t, rtol=RTOL)


# ---------------------------------------------------------------------------------------------------
# 5-6. probe layout, shared-mean need
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batches", "chunks", "expected"),
    [
        ([32, 16], 8, (8, 2, False)),
        ([16, 33], 8, (8, 2, False)),
        ([10, 7, 12], 4, (4, 1, False)),
        ([3], 8, (3, 1, False)),
        ([2, 100], 8, (2, 1, False)),
        ([25, 30], 4, (4, 6, False)),
        ([1, 5], 4, (4, 1, True)),
        ([5, 1], 6, (6, 1, True)),
    ],
)
def test_probe_layout(batches: list[int], chunks: int, expected: tuple[int, int, bool]) -> None:
    assert probe_layout(batches, chunks) == expected


def test_probe_layout_fits_smallest_batch() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        batches = [int(x) for x in rng.integers(2, 200, size=int(rng.integers(1, 5)))]
        chunks = int(rng.integers(1, 20))
        k, c, extra = probe_layout(batches, chunks)
        s = min(batches)
        assert not extra
        assert k == min(s, chunks)
        assert c >= 1 and k * c <= s < k * (c + 1)


@pytest.mark.parametrize(
    ("test", "estimator", "exact", "expected"),
    [
        ("norm", "pooled", False, False),
        ("norm", "pooled", True, True),
        ("norm", "paper", False, True),
        ("none", "pooled", False, False),
        ("none", "pooled", True, True),
        ("inner_product", "pooled", False, True),
        ("augmented_inner_product", "pooled", False, True),
        ("inner_product", "paper", True, True),
    ],
)
def test_needs_shared_mean(test: str, estimator: str, exact: bool, expected: bool) -> None:
    assert needs_shared_mean(test, estimator, exact) is expected


def test_the_reference_formula_reproduces_the_reference_arithmetic() -> None:
    """ALGORITHM.md §9.1, computed the reference's way on explicit vectors: Var(p) with M − 1, one unbiased
    variance over every entry of the stacked orthogonal parts, ν in both, no c and no 1/M."""
    rng = np.random.default_rng(7)
    M, P = 3, 50
    g = rng.normal(0.3, 1.0, size=(M, P))  # each worker's last gradient (the paper estimator: k = 1)
    nu = 0.3
    gbar = g.mean(0)
    g2 = float(gbar @ gbar)
    p = g @ gbar
    orth = g - (p / g2)[:, None] * gbar
    t_ip = np.var(p, ddof=1) / (nu**2 * g2**2)
    t_orth = np.var(orth.reshape(-1), ddof=1) / (nu**2 * g2)
    expected = max(t_ip, t_orth)
    stats = [
        batching.WorkerStats(
            1, 16, float(g[m] @ g[m]), float(g[m] @ g[m]), float(p[m]), float(p[m] ** 2), float(g[m].sum())
        )
        for m in range(M)
    ]
    st = batching.pool(stats, g2, n_params=P)
    assert st is not None
    assert st.entry_var == pytest.approx(np.var(orth.reshape(-1), ddof=1), rel=1e-9)
    got = Rule("augmented_inner_product", 0.65, 0.01, nu, formula="reference").target(st)
    assert got == pytest.approx(expected, rel=1e-9)
    assert Rule("inner_product", 0.65, 0.01, nu, formula="reference").target(st) == pytest.approx(t_ip)
    # ALGORITHM.md §2.2's own form multiplies by c and divides by M and ϑ² (ϑ = 0.01: 10⁴ times the reference's)
    spec = Rule("inner_product", 0.65, 0.01, nu).target(st)
    assert spec == pytest.approx(16 * np.var(p, ddof=1) / (M * 0.01**2 * g2**2))
    dec = Rule("augmented_inner_product", 0.65, 0.01, nu, formula="reference").decide(4, st, cap=10**9)
    assert dec.request == max(4, int(np.ceil(expected)))


# ---------------------------------------------------------------------------------------------------
# batch.noise_rows: the noise the norm test adds to its ‖∇F‖² estimate (ALGORITHM.md §2.5)
# ---------------------------------------------------------------------------------------------------


def _pure_noise(workers: int, k: int, c: int, seed: int = 0) -> TrainerStats:
    """Pooled scalars-only statistics of zero-mean gradients: the estimate of ‖∇F‖² clips at zero."""
    rng = np.random.default_rng(seed)
    st = pool([_worker_stats(rng.normal(size=(k, 7)), c) for _ in range(workers)])
    assert st is not None
    return st


def test_a_probe_that_misses_rows_holds_the_request_where_it_is() -> None:
    """4 workers requesting 10 rows, a step of 10 probed as 8 chunks of 1 (or a step capped at b_max 8): at
    η 0.9 the probed rows bound T at 8/0.81 = 9.88 < 10, so the request never grows whatever the gradients
    say (the fixed point the compute-optimal run sat in for 500 rounds)."""
    st = _pure_noise(workers=4, k=8, c=1)
    t = Rule("norm", 0.9, VARTHETA, NU).target(st)
    assert t == pytest.approx(8 / 0.81, rel=1e-9)
    assert Rule("norm", 0.9, VARTHETA, NU).decide(10, st, cap=32).request == 10


def test_the_requested_rows_bound_the_norm_test_instead() -> None:
    st = _pure_noise(workers=4, k=8, c=1)
    t = Rule("norm", 0.9, VARTHETA, NU).target(st, rows=4 * 10)
    assert t == pytest.approx(10 / 0.81, rel=1e-9)  # the request over η², not the probed rows
    d = Rule("norm", 0.9, VARTHETA, NU).decide(10, st, cap=32, rows=4 * 10)
    assert (d.request, d.reason) == (13, "grew")
    # no more rows requested than probed: T as without (an extra probe batch bounds by what it probed)
    without = Rule("norm", 0.9, VARTHETA, NU).target(st)
    assert Rule("norm", 0.9, VARTHETA, NU).target(st, rows=4 * 8) == without
    assert Rule("norm", 0.9, VARTHETA, NU).target(st, rows=4 * 2) == without


def test_the_requested_rows_keep_the_gradient_estimate() -> None:
    """Where ‖∇F‖² dominates, the bound is far and the two ways agree closely; in every case only the noise
    term moves: E‖ḡ‖² = ‖∇F‖² + σ̂²/B, ‖∇F‖² the same unbiased estimate."""
    rng = np.random.default_rng(1)
    st = pool([_worker_stats(3.0 + rng.normal(size=(8, 7)), 1) for _ in range(4)])
    assert st is not None
    grad = st.gbar_sq - st.sigma2 / 32
    assert grad > 0
    want = st.sigma2 / (4 * 0.9**2 * (grad + st.sigma2 / 40))
    assert Rule("norm", 0.9, VARTHETA, NU).target(st, rows=40) == pytest.approx(want, rel=1e-12)
    # with the trainer's mean all-reduced (batch.exact_mean, the paper estimator) ‖ḡ‖² is exact: the same
    exact = TrainerStats(st.n, st.c, st.workers, st.sigma2, st.gbar_sq, math.nan, math.nan, True)
    assert Rule("norm", 0.9, VARTHETA, NU).target(exact, rows=40) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("eta", [1.0, 1.3])
def test_at_eta_one_or_more_the_norm_test_never_lifts_a_request_past_its_ceiling(eta: float) -> None:
    """What a run at batch.eta >= 1 is told at its start (:func:`adloco.library.batch_tests.norm_test_ceiling`):
    over noise alone and with a signal, the rows probed or requested, one or several workers, a request
    whose rows are all probed or a request of 1 probed by an extra batch of 8 rows, the next request never
    exceeds max(b, ceil(8/η²)) and, when the rows probed are not more than the request's, never grows."""
    from adloco.library.batch_tests import norm_test_ceiling
    from adloco.library.settings import AdaptiveBatch

    rule = Rule("norm", eta, VARTHETA, NU)
    rng = np.random.default_rng(0)
    for trial in range(40):
        workers, signal = 1 + trial % 4, (0.0, 0.3, 3.0)[trial % 3]
        for b, k, c in ((1, 8, 1), (4, 4, 1), (10, 8, 1), (16, 8, 2)):  # (1, 8, 1): the extra probe batch
            st = pool([_worker_stats(signal + rng.normal(size=(k, 7)), c) for _ in range(workers)])
            assert st is not None
            ceiling = norm_test_ceiling(AdaptiveBatch(eta=eta, initial=b, max=64))
            assert ceiling == max(b, math.ceil(8 / eta**2))
            for rows in (None, workers * b):
                request = rule.decide(b, st, cap=64, rows=rows).request
                assert request <= ceiling
                if k * c <= b:
                    assert request == b
    assert norm_test_ceiling(AdaptiveBatch(eta=0.99)) is None
    assert norm_test_ceiling(AdaptiveBatch(eta=1.0, test="inner_product")) is None
