"""Phase 3 of a round (ALGORITHM.md §6): every trainer's batch test -> its new request (ALGORITHM.md §2).

The tests read the round's gradient statistics, gathered in phase 1, never θ, so they do not wait for
what is in flight (ALGORITHM.md §13); their own mean-gradient reduction (ALGORITHM.md §2.5,
:meth:`BatchTests.shared_mean`) stays on the critical path. The decisions are pure functions of gathered
scalars (:mod:`adloco.library.algorithms.batching`), the same on every process.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping

import torch

from adloco import events
from adloco.library.algorithms import batch_schedule, batching, lr_scaling
from adloco.library.comm.base import Comm
from adloco.library.replica import Replica
from adloco.library.round import Gathered
from adloco.library.settings import AdaptiveBatch
from adloco.library.trainer import Trainer

log = logging.getLogger("adloco")


def norm_test_ceiling(batch: AdaptiveBatch) -> int | None:
    """The largest request the norm test can ever set when it cannot grow freely (η >= 1), else None.

    Its target is bounded by the rows a worker's statistics stand for over η² (ALGORITHM.md §2.5): T <=
    n·c/(M η²) with the rows probed, T <= max(n·c/M, b)/η² with the rows requested (the ``paper`` estimator:
    e/η², e <= b). A worker probes at most max(b, ``probe_chunks``) rows (more than its request only in the
    extra probe batch of a one-row step), so at η >= 1, T <= max(b, probe_chunks/η²) and the next request,
    max(b, ceil(T)), never exceeds max(b, ceil(probe_chunks/η²)): from ``initial`` no request passes that."""
    if batch.test != "norm" or batch.eta < 1:
        return None
    return max(batch.initial, math.ceil(batch.probe_chunks / batch.eta**2))


class BatchTests:
    """The trainers' batch tests, with what they need from this process: the ``batch`` dial, the
    communicator, this process's replicas (their probe gradients), the algorithm's reducer ``reduce(workers,
    kind, out, add)`` and a scratch P-vector."""

    def __init__(
        self,
        batch: AdaptiveBatch,
        comm: Comm,
        replicas: Mapping[int, Replica],
        reduce: Callable[..., bool],
        scratch: torch.Tensor,
    ) -> None:
        self.batch, self.comm, self.replicas = batch, comm, replicas
        self.reduce, self.scratch, self.n_params = reduce, scratch, scratch.numel()

    def warn(self, members: Mapping[int, list[int]]) -> None:
        """Say when the ``paper`` estimator cannot test a trainer yet (it needs two workers), and when the norm
        test cannot grow a request (:func:`norm_test_ceiling`)."""
        b = self.batch
        ceiling = norm_test_ceiling(b)
        if ceiling is not None:
            where = f"the batch stays at batch.initial ({b.initial})" + (
                " all run"
                if ceiling <= b.initial
                else f", or reaches {ceiling} at most where a step has one row"
            )
            log.warning(
                f"batch.eta {b.eta:g} with the norm test: the test's target is bounded by a worker's rows over "
                "η² (ALGORITHM.md §2.5), at η >= 1 by the request itself (by batch.probe_chunks/η² where a step "
                f"has one row): {where}; η below 1 lets it grow (the paper's: 0.8)"
            )
        if b.estimator == "paper" and b.probing and min(map(len, members.values())) < 2:
            log.warning(
                "batch estimator 'paper' needs two or more workers per trainer: a trainer with one worker "
                "keeps its request until a merge gives it more (the pooled estimator has no such limit)"
            )

    def run(
        self,
        trainers: Mapping[int, Trainer],
        gathered: Gathered,
        round_: int,
        counts_rows: bool,
        seen: int = 0,
    ) -> list[events.Trainer]:
        """Phase 3 of a round (ALGORITHM.md §6): every trainer's batch test (ALGORITHM.md §2) on its finite
        workers' pooled statistics, with the mean probe gradient where the test needs it
        (:meth:`shared_mean`) -> its new request, set on the trainer; returns the trainers' events.
        ``round_``: the rounds completed before this one; ``counts_rows``: whether examples are known;
        ``seen``: the training examples read by the end of this round (a batch schedule's D, ALGORITHM.md
        §15)."""
        members, ok, results = gathered.members, gathered.ok, gathered.results
        stats = {w: res.stats for w, res in results.items()}
        b, r = self.batch, round_
        shared = b.probing and batching.needs_shared_mean(b.test, b.estimator, b.exact_mean)
        need_p = b.test in ("inner_product", "augmented_inner_product")
        gbar_sq, dots = self.shared_mean(trainers, ok, stats, need_p) if shared else ({}, {})
        out = []
        for t in sorted(trainers):
            ws = members[t]
            samples = [stats[w] for w in ok[t]]
            pooled = None
            if samples and all(s is not None for s in samples) and len({s.c for s in samples if s}) == 1:
                got = [s for s in samples if s is not None]
                if need_p and t in dots:
                    got = [
                        batching.WorkerStats(s.n, s.c, s.sum_sq, s.mean_sq, *dots[t][w], s.sum_entries)
                        for s, w in zip(got, ok[t], strict=True)
                    ]
                pooled = batching.pool(got, gbar_sq.get(t) if shared else None, self.n_params)
            tr = trainers[t]
            rows = b.noise_of(pooled.workers, tr.request) if pooled else None
            dec = b.rule.decide(tr.request, pooled, cap=b.max, rows=rows)
            if b.schedule != "none":  # the request follows the examples read by now (ALGORITHM.md §15)
                dec = batching.Decision(batch_schedule.of(b, seen), math.nan, "scheduled")
            # B̂ from this round's statistics (ALGORITHM.md §10)
            if b.lr_scaling == "gain" and pooled is not None:
                tr.noise = lr_scaling.update_noise(tr.noise, pooled.sigma2, pooled.gbar_sq)
            if dec.reason == "degenerate":
                log.warning(
                    f"round {r + 1}: trainer {t}: vanishing or non-finite gradient statistics; "
                    f"request kept at {tr.request}"
                )
            n_ex = sum(results[w].examples for w in ws)
            lead = results[ws[0]]
            times = [results[w].compute_s for w in ws]
            idle = 1.0 - (sum(times) / len(times)) / max(times) if len(times) > 1 and max(times) > 0 else 0.0
            out.append(
                events.Trainer(
                    round=r + 1,
                    trainer=t,
                    workers=ws,
                    request=tr.request,
                    request_next=dec.request,
                    target=events.num(dec.target),
                    reason=dec.reason,
                    loss=events.num(sum(results[w].loss * results[w].examples for w in ws) / max(n_ex, 1)),
                    sigma2=events.num(pooled.sigma2) if pooled else None,
                    gbar_sq=events.num(pooled.gbar_sq) if pooled else None,
                    samples=pooled.n if pooled else None,
                    effective=lead.micro * lead.accum if lead.micro else 0,
                    micro=lead.micro,
                    accum=lead.accum,
                    idle_share=idle,
                    examples=n_ex if counts_rows else None,
                    lr=events.num(lead.lr),
                    lr_scale=lead.lr_scale,
                )
            )
            tr.request = dec.request
        return out

    def shared_mean(
        self,
        trainers: Mapping[int, Trainer],
        members: dict[int, list[int]],
        stats: dict[int, batching.WorkerStats | None],
        need_p: bool,
    ) -> tuple[dict[int, float], dict[int, dict[int, tuple[float, float]]]]:
        """Reduce every trainer's mean probe gradient ḡ (P values) among its workers; returns ‖ḡ‖² per
        trainer and, for the inner-product tests, every worker's (Σ_j <g_j, ḡ>, Σ_j <g_j, ḡ>²).

        Only processes hosting a worker of trainer t see its ḡ, so ‖ḡ‖² and the dot products travel in
        the scalar gather that follows: every process must decide every request from the same numbers.
        """
        paper = self.batch.estimator == "paper"
        rows: dict[int, list[float]] = {w: [math.nan, math.nan, math.nan] for w in self.replicas}
        pooled: list[int] = []
        for t in sorted(trainers):
            got = [stats[w] for w in members[t]]
            if not got or any(s is None for s in got) or len({s.c for s in got if s}) != 1:
                continue
            pooled.append(t)
            n_t = sum(s.n for s in got if s)
            buf = self.scratch
            self.reduce(members[t], "probe", buf, functools.partial(self._add_sample_sum, paper=paper))
            gbar = buf.div_(n_t)  # ḡ: (P,)
            g2 = float(self.comm.shards.sum_(torch.dot(gbar, gbar).reshape(1).double())[0])  # every shard
            for w in [w for w in members[t] if w in self.replicas]:
                rows[w][0] = g2
                if need_p:
                    p = self.replicas[w].sample_dots(gbar, paper)  # (k,)
                    rows[w][1:] = [float(p.sum()), float((p * p).sum())]
        gathered = self.comm.all_gather_rows(rows, 3, "stats", counted=3 if need_p else 1)
        dots = (
            {t: {w: (gathered[w][1], gathered[w][2]) for w in members[t]} for t in pooled} if need_p else {}
        )
        return {t: gathered[members[t][0]][0] for t in pooled}, dots

    def _add_sample_sum(self, w: int, out: torch.Tensor, paper: bool) -> None:
        self.replicas[w].add_sample_sum(out, paper)
