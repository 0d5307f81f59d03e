"""Adaptive batch tests (ALGORITHM.md §2): gradient statistics -> the next request b.

Everything here is pure arithmetic on scalars. A worker reduces its gradient samples g_1..g_k (each the
mean gradient over c examples, all at the same parameters) to a few scalars (:class:`WorkerStats`); the
coordinator gathers them and pools them per trainer (:func:`pool`); a test turns the pooled statistics
into a target T and the request grows to ``min(cap, max(b, ceil(T)))`` (:class:`Rule`).

Two ways to pool (ALGORITHM.md §2.5):

* shared mean (``gbar_sq`` given): the trainer's mean gradient ḡ over all n = Σ k_m samples was
  all-reduced, so ‖ḡ‖² and p_j = <g_j, ḡ> are exact and
  σ̂² = c Σ_j ‖g_j − ḡ‖² / (n − 1) = c (Σ_j ‖g_j‖² − n ‖ḡ‖²) / (n − 1).
  The inner-product and orthogonality tests need this, and so does the ``paper`` estimator.
* scalars only (norm test, default): no P-vector crosses the network. σ̂² is the within-worker pooled
  variance c Σ_m Σ_j ‖g_mj − ḡ_m‖² / (n − M), unbiased for the per-example variance σ² (every sample of a
  trainer is drawn at the same θ from the same distribution). ‖ḡ‖² is replaced by an unbiased estimate
  of its expectation, ‖∇F‖² + σ²/(n c), with ‖∇F‖² estimated as mean_m(‖ḡ_m‖² − σ̂²/(k_m c)) (McCandlish
  et al. 2018, |G|²) and clipped at zero. With one worker this equals the exact value whenever the clip
  is inactive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

NAN = float("nan")


@dataclass(frozen=True)
class WorkerStats:
    """What one worker knows about its k gradient samples (each a mean over c examples).

    ``sum_p`` and ``sum_p2`` are filled once the trainer's shared mean ḡ is known.
    """

    n: int  # k: number of gradient samples
    c: int  # examples per sample
    sum_sq: float  # Σ_j ‖g_j‖²
    mean_sq: float  # ‖ḡ_m‖², ḡ_m = (1/k) Σ_j g_j
    sum_p: float = NAN  # Σ_j <g_j, ḡ>
    sum_p2: float = NAN  # Σ_j <g_j, ḡ>²
    sum_entries: float = NAN  # Σ_j Σ_i g_ji: the sum of every entry (the reference formula's variance)


@dataclass(frozen=True)
class TrainerStats:
    """Pooled statistics of one trainer's n = Σ k_m gradient samples."""

    n: int
    c: int
    workers: int  # M
    sigma2: float  # σ̂²: per-example gradient variance (trace of the covariance)
    gbar_sq: float  # ‖ḡ‖² (exact with a shared mean, else an unbiased estimate of its expectation)
    var_p: float  # Var_j <g_j, ḡ> (n − 1 in the denominator); nan without a shared mean
    orth_sq: float  # Σ_j ‖g_j − (<g_j, ḡ>/‖ḡ‖²) ḡ‖²; nan without a shared mean
    exact: bool  # True when ḡ was shared
    entry_var: float = NAN  # unbiased variance of all n·P entries of the g_j^⊥ (ALGORITHM.md §9.1), or nan


def pool(
    stats: Sequence[WorkerStats], gbar_sq: float | None = None, n_params: int | None = None
) -> TrainerStats | None:
    """Pool the workers of one trainer (law of total variance). None when there are too few samples.

    ``gbar_sq``: ‖ḡ‖² of the all-reduced mean; None for the scalars-only estimate. ``n_params``: P, for
    the reference formula's per-entry variance of the orthogonal parts (ALGORITHM.md §9.1), which needs every
    sample's entry sum s_j = Σ_i g_ji: with e_ji = g_ji − (p_j/‖ḡ‖²) ḡ_i and s̄ = Σ_i ḡ_i = Σ_j s_j / n,
    Σ e = Σ_j s_j − Σ_j p_j · s̄/‖ḡ‖² and Σ e² = Σ_j ‖g_j‖² − Σ_j p_j²/‖ḡ‖², so scalars suffice.
    """
    if not stats:
        return None
    c = stats[0].c
    if any(s.c != c for s in stats):
        raise ValueError("all gradient samples of a trainer must average the same number of examples")
    n = sum(s.n for s in stats)
    M = len(stats)
    sum_sq = sum(s.sum_sq for s in stats)
    if gbar_sq is not None:
        if n < 2:
            return None
        sigma2 = c * max(sum_sq - n * gbar_sq, 0.0) / (n - 1)
        var_p = orth = entry_var = NAN
        if all(math.isfinite(s.sum_p) and math.isfinite(s.sum_p2) for s in stats):
            sp = sum(s.sum_p for s in stats)
            sp2 = sum(s.sum_p2 for s in stats)
            var_p = max(sp2 - sp * sp / n, 0.0) / (n - 1)
            orth = max(sum_sq - sp2 / gbar_sq, 0.0) if gbar_sq > 0 else NAN
            if n_params and gbar_sq > 0 and all(math.isfinite(s.sum_entries) for s in stats):
                total = n * n_params
                s_all = sum(s.sum_entries for s in stats)
                e_sum = s_all - sp * (s_all / n) / gbar_sq
                entry_var = max(orth - e_sum * e_sum / total, 0.0) / (total - 1)
        return TrainerStats(n, c, M, sigma2, gbar_sq, var_p, orth, True, entry_var)
    if n - M < 1 or any(s.n < 1 for s in stats):
        return None
    within = sum(max(s.sum_sq - s.n * s.mean_sq, 0.0) for s in stats)
    sigma2 = c * within / (n - M)
    grad_sq = sum(s.mean_sq - sigma2 / (s.n * c) for s in stats) / M  # unbiased ‖∇F‖²
    est = max(grad_sq, 0.0) + sigma2 / (n * c)
    return TrainerStats(n, c, M, sigma2, est, NAN, NAN, False)


def needs_shared_mean(test: str, estimator: str, exact_mean: bool) -> bool:
    """Whether the trainer's mean gradient sample must be all-reduced (P values) this round."""
    if test in ("inner_product", "augmented_inner_product") or estimator == "paper":
        return True
    return exact_mean


@dataclass(frozen=True)
class Decision:
    request: int  # the request for the next round
    target: float  # T (nan when not computed)
    reason: str  # grew | kept | capped | off | no-statistics | degenerate


@dataclass(frozen=True)
class Rule:
    """A batch test and its parameters (``batch.test``, ``eta``, ``vartheta``, ``nu``, ``formula``): what
    turns one trainer's pooled statistics into a target T (:meth:`target`) and the next request
    (:meth:`decide`)."""

    test: str
    eta: float
    vartheta: float
    nu: float
    formula: str = "spec"

    def target(self, st: TrainerStats, rows: int | None = None) -> float:
        """T of ALGORITHM.md §2.1–2.4 for one trainer (nan when the test cannot be evaluated).

        ``rows`` (norm test, ``batch.noise_rows: requested``): the trainer's requested rows. When they
        exceed the n·c probed, the noise σ̂²/(n c) that ‖ḡ‖² holds is replaced by σ̂²/rows, so that T is
        bounded by the request over η² rather than by the probed rows over η² (ALGORITHM.md §2.5).

        ``formula: reference`` is the reference implementation's inner-product tests (ALGORITHM.md §9.1):
        ν in both parts, no factor c and no 1/M, and the orthogonal part's per-entry variance instead of
        the trace: T_ip = Var_j(p_j)/(ν²‖ḡ‖⁴), T_orth = var(entries of the g_j^⊥)/(ν²‖ḡ‖²).
        """
        test, nu = self.test, self.nu
        g2, M, c, n = st.gbar_sq, st.workers, st.c, st.n
        if not (math.isfinite(g2) and g2 > 0):
            return NAN
        if test == "norm":
            if rows is not None and rows > n * c:
                g2 = max(g2 - st.sigma2 / (n * c), 0.0) + st.sigma2 / rows
                if not g2 > 0:
                    return NAN
            return st.sigma2 / (M * self.eta**2 * g2)
        if self.formula == "reference":
            t_ip_ref = st.var_p / (nu**2 * g2 * g2)
            if test == "inner_product":
                return t_ip_ref
            if test == "augmented_inner_product":
                return max(t_ip_ref, st.entry_var / (nu**2 * g2))
            raise ValueError(f"unknown batch test {test!r}")
        t_ip = c * st.var_p / (M * self.vartheta**2 * g2 * g2)
        if test == "inner_product":
            return t_ip
        t_orth = c * st.orth_sq / ((n - 1) * M * nu**2 * g2)
        if test == "augmented_inner_product":
            return max(t_ip, t_orth)
        raise ValueError(f"unknown batch test {test!r}")

    def decide(self, b: int, st: TrainerStats | None, *, cap: int, rows: int | None = None) -> Decision:
        """b <- min(cap, max(b, ceil(T))): tests only ever grow the request (ALGORITHM.md §2). ``rows``: as
        :meth:`target`'s.

        A vanishing or non-finite ‖ḡ‖² (or T) leaves b as it is with reason ``degenerate``: never a crash.
        """
        if self.test == "none":
            return Decision(b, NAN, "off")
        if st is None:
            return Decision(b, NAN, "no-statistics")
        if not (math.isfinite(st.gbar_sq) and st.gbar_sq > 0 and math.isfinite(st.sigma2)):
            return Decision(b, NAN, "degenerate")
        t = self.target(st, rows)
        if not math.isfinite(t):
            return Decision(b, t, "degenerate")
        if t > cap:
            return Decision(max(b, cap), t, "capped")
        new = max(b, math.ceil(t))
        return Decision(new, t, "grew" if new > b else "kept")


def probe_layout(effective_batches: Sequence[int], probe_chunks: int) -> tuple[int, int, bool]:
    """Chunking of the pooled estimator for one trainer: (k chunks, c examples each, extra probe?).

    All workers of a trainer use the same c, so the chunks are cut from the smallest effective batch
    among them. When that batch holds fewer than two examples, an extra probe batch of ``probe_chunks``
    single examples is drawn at the common point (ALGORITHM.md §2.5).
    """
    s = min(effective_batches)
    if s >= 2:
        k = min(s, probe_chunks)
        return k, s // k, False
    return probe_chunks, 1, True
