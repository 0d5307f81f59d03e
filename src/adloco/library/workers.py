"""This process's workers within a round: their bookkeeping from the first inner step to phase 1 of the
round's end (ALGORITHM.md §6), what each reports, the undo of an aborted round, and each worker's own state
(its inner optimizer, its error feedback).

The replicas (:class:`adloco.library.replica.Replica`) run the inner steps; the algorithm drives them. Nothing here
knows about trainers beyond the ids it is handed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from adloco import events
from adloco.library.algorithms import batching, lr_scaling, switch
from adloco.library.comm.base import Comm, Shards
from adloco.library.comm.quantize import ErrorFeedback
from adloco.library.optim import CombinedOptimizer
from adloco.library.replica import LossFn, Replica
from adloco.library.round import (
    WIDTH,
    Clock,
    WorkerPlan,
    WorkerProgress,
    WorkerRound,
    measured_speed,
    plan_round,
)
from adloco.library.settings import AdaptiveBatch, Switch
from adloco.library.snapshot import InnerSnapshot
from adloco.library.trainer import Trainer

log = logging.getLogger("adloco")


def build_replicas(
    model: nn.Module | Sequence[nn.Module],
    inner_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    comm: Comm,
    loss_fn: LossFn | None,
    clip: float,
    precision: Any,
    b_max: int,
    cuda_graphs: bool = False,
) -> dict[int, Replica]:
    """One replica per local worker of ``comm`` from the user's model(s) and inner optimizer(s) (one each,
    or lists of them), all of one size; a mismatch is a ValueError naming the argument. A worker's
    optimizer may be several (a list or tuple: Muon and AdamW), combined into one
    (:class:`adloco.library.optim.CombinedOptimizer`); with one model, a list of several optimizers is that."""
    models, optimizers = as_list(model, "model"), as_list(inner_optimizer, "inner_optimizer")
    if len(models) == 1 and len(optimizers) > 1:
        optimizers = [optimizers]
    optimizers = [CombinedOptimizer(*o) if isinstance(o, (list, tuple)) else o for o in optimizers]
    if len(models) != len(optimizers):
        raise ValueError(
            f"inner_optimizer: {len(optimizers)} optimizer(s) for {len(models)} model(s); give one per model"
        )
    if len(comm.local_workers) != len(models):
        raise ValueError(
            f"model: {len(models)} replica(s) given, but the communicator hosts "
            f"{len(comm.local_workers)} worker(s) in this process"
        )
    replicas = {
        w: Replica(
            m,
            o,
            loss_fn,
            clip=clip,
            precision=precision,
            b_max=b_max,
            shards=comm.shards,
            cuda_graphs=cuda_graphs,
            name=f"worker {w}",
        )
        for w, m, o in zip(comm.local_workers, models, optimizers, strict=True)
    }
    sizes = {r.flat.numel for r in replicas.values()}
    if len(sizes) != 1:
        raise ValueError(f"model: replicas of different sizes ({sorted(sizes)} parameters); all must match")
    return replicas


def as_list(x: Any, what: str) -> list[Any]:
    """One object or a non-empty list of them, as a list (a ValueError naming the argument)."""
    if isinstance(x, (list, tuple)):
        if not x:
            raise ValueError(f"{what}: an empty list")
        return list(x)
    return [x]


def plan_workers(
    trainers: Mapping[int, Trainer],
    members: Mapping[int, list[int]],
    b_max: Mapping[int, int],
    speeds: Mapping[int, Mapping[int, float] | None],
    dials: tuple[Switch, AdaptiveBatch, float],
    allocation: Mapping[int, int],
    replicas: Mapping[int, Replica],
) -> tuple[str, dict[int, WorkerPlan]]:
    """The round's switch mode (ALGORITHM.md §5) and every worker's plan (:func:`adloco.library.round.plan_round`,
    computed alike everywhere: it needs the others'), and each trainer's inner lr multiplier (ALGORITHM.md
    §10: it follows the rows its steps use, b_t; b₀ its first) set on the trainers and this process's
    replicas. ``dials``: the switch and batch dials, and a pass's fixed cost in rows."""
    sw, batch, fixed_rows = dials
    mode = switch.mode_for(sw.schedule, sw.mode, len(trainers))
    every = plan_round(
        {t: tr.request for t, tr in sorted(trainers.items())},
        members,
        b_max,
        mode,
        sw,
        batch,
        speeds,
        fixed_rows,
    )
    grown: dict[int, float] = {}  # b_t / b₀ of each trainer
    for t, ws in members.items():
        tr = trainers[t]
        b_t = sum(every[w].effective for w in ws) / len(ws)
        if tr.b0 is None:
            tr.b0 = b_t
        grown[t] = b_t / tr.b0 if tr.b0 > 0 else 1.0
        tr.lr_ratio = lr_scaling.ratio(batch.lr_scaling, b_t, tr.b0, tr.noise)
    for w, rep in replicas.items():
        t = allocation[w]
        r = trainers[t].lr_ratio
        rep.lr_scale = (
            lr_scaling.multiplier(r, rep.sgd, batch.lr_scale_max) if batch.lr_scaling != "none" else 1.0
        )
        rep.wd_scale = lr_scaling.wd_multiplier(batch.wd_scaling, grown.get(t, 1.0), rep.lr_scale)
    return mode, every


class Workers:
    """This process's workers: their replicas, their error feedback (``comm.error_feedback``; reset when a
    worker moves, kept in its state), and the current round's progress and snapshots.

    ``inner_state``: keep, or reset the inner optimizer every round. ``snapshot``: keep each worker's inner
    state at the round's start in host memory, so an aborted round is undone in place. ``feedback``:
    keep each worker's error feedback, decaying at ``decay`` (β, ``comm.error_decay``)."""

    def __init__(
        self,
        replicas: dict[int, Replica],
        device: torch.device,
        inner_state: str,
        snapshot: bool,
        feedback: bool,
        decay: float = 1.0,
    ) -> None:
        self.replicas = replicas
        self.device = device
        self.inner_state, self.keep_snapshot = inner_state, snapshot
        self.feedback: dict[int, ErrorFeedback] | None = (
            {w: ErrorFeedback(decay) for w in replicas} if feedback else None
        )
        self.progress: dict[int, WorkerProgress] | None = None  # the round's, from its first step
        self._snap: dict[int, InnerSnapshot] = {}  # snapshot: each worker's inner state at the round's start

    def agreed_b_max(self, comm: Comm) -> dict[int, int]:
        """Every worker's b_max (its replica's), on every process (a gather, not counted)."""
        got = comm.all_gather_rows(
            {w: [rep.b_max] for w, rep in self.replicas.items()}, 1, "check", counted=0
        )
        return {w: int(v[0]) for w, v in got.items()}

    def begin(self) -> dict[int, WorkerProgress]:
        """The round's bookkeeping, begun (inner state reset, snapshot) before its first step."""
        if self.progress is None:
            for w, rep in self.replicas.items():
                if self.inner_state == "reset":
                    rep.reset_optimizer()
                if self.keep_snapshot:  # host buffers reused from round to round (adloco.library.snapshot)
                    self._snap[w] = rep.snapshot(self._snap.get(w))
            self.progress = {
                w: WorkerProgress(Clock(self.device), skipped_before=rep.skipped)
                for w, rep in self.replicas.items()
            }
        return self.progress

    def step(
        self,
        batches: Mapping[int, Any],
        plans: Mapping[int, WorkerPlan],
        h: int,
        scratch: torch.Tensor,
        emulate: Sequence[float] | None,
        ddp: bool,
    ) -> dict[int, torch.Tensor]:
        """Inner step h of the round for every local worker (the probe's chunks at h = 0), counted in the
        round's progress; returns each worker's mean loss. DDP: the gradients only (the update follows
        their average, :meth:`ddp_step`). With ``cuda_graphs`` every worker steps on its own stream: all
        wait for what is queued, run side by side, and what follows waits for all of them
        (:mod:`adloco.library.graphs`, ALGORITHM.md §14)."""
        progress, losses = self.begin(), {}
        for rep in self.replicas.values():
            rep.fork()
        for w in sorted(self.replicas):
            plan, rep, pr = plans[w], self.replicas[w], progress[w]
            probe = plan.probe if h == 0 else None
            with rep.on_stream():
                pr.clock.start()
                if ddp:
                    loss, stats = rep.gradient(batches[w], plan.effective, plan.micro, probe, scratch)
                else:
                    before = functools.partial(self.before_write, w)
                    loss, stats = rep.step(batches[w], plan.effective, plan.micro, probe, scratch, before)
                if emulate is not None:
                    pr.clock.stretch(emulate[w])
                pr.clock.stop()
                pr.loss = loss if pr.loss is None else pr.loss + loss
            if stats is not None:
                pr.stats = stats
            if probe is not None and probe.extra:
                pr.probe_examples += probe.extra_rows
            pr.steps += 1
            pr.examples += plan.effective
            losses[w] = loss
        for rep in self.replicas.values():
            rep.join()
        return losses

    def rows(
        self, plans: Mapping[int, WorkerPlan], batch: AdaptiveBatch, abort: bool, shards: Shards
    ) -> dict[int, list[float]]:
        """Phase 1: every local worker's scalars for the gather (statistics, loss, sizes, finiteness, times,
        a stop request); a sharded worker's from its ranks' (:func:`whole_worker`)."""
        progress = self.begin()
        local: dict[int, list[float]] = {}
        for w, rep in self.replicas.items():
            pr = progress[w]
            st = pr.stats
            if batch.estimator == "paper" and batch.probing and pr.steps:  # the last gradient, unclipped
                sq, entries = rep.last_gradient()
                st = batching.WorkerStats(1, plans[w].effective, sq, sq, sum_entries=entries)
            mean = (pr.loss / pr.steps).item() if pr.steps and pr.loss is not None else math.nan
            params_finite = rep.finite()  # on every shard: every rank of a worker calls it
            finite = pr.steps > 0 and (math.isfinite(mean) or pr.loss is None) and params_finite
            local[w] = WorkerRound(
                k=st.n if st else 0,
                c=st.c if st else 0,
                sum_sq=st.sum_sq if st else math.nan,
                mean_sq=st.mean_sq if st else math.nan,
                sum_entries=st.sum_entries if st else math.nan,
                has_stats=st is not None,
                loss=mean,
                steps=pr.steps,
                examples=pr.examples,
                probe_examples=pr.probe_examples,
                finite=finite,
                compute_s=pr.clock.seconds(),
                micro=min(plans[w].micro, rep.b_max),
                accum=plans[w].accum,
                capped=plans[w].capped,
                skipped=rep.skipped - pr.skipped_before,
                aborted=abort,
                b_max=rep.b_max,
                lr=rep.last_lr,
                lr_scale=rep.lr_scale,
            ).to_row()
        if shards.size > 1:
            local = {w: whole_worker(row, shards) for w, row in local.items()}
        return local

    def between_rounds(self, what: str, H: int) -> None:
        """Refuse ``what`` in the middle of a round: a state holds whole rounds (ALGORITHM.md §6), and one
        taken after a few inner steps would silently resume from the round's start."""
        done = min((p.steps for p in self.progress.values()), default=0) if self.progress else 0
        if done:
            raise ValueError(
                f"{what}: called in the middle of a round ({done} of its {H} inner steps taken); a state holds "
                f"whole rounds: call it between rounds, after a round's H-th step (step_in_round is then 0)"
            )

    def end(self) -> None:
        """The round is over (ended or aborted): the next step begins another."""
        self.progress = None

    def ddp_step(
        self, members: Mapping[int, list[int]], reduce: Callable[..., bool], stop: bool, buf: torch.Tensor
    ) -> bool:
        """Synchronous data parallel (ALGORITHM.md §1): every trainer's workers average their gradients (one
        reduction of P values, counted as ``grad``, into ``buf``) and take the same step. A stop request
        rides along as control (``buf``'s last value), so every worker of a trainer stops at the same
        step; returns whether one was made anywhere."""
        progress = self.begin()
        for t in sorted(members):
            ws = members[t]
            buf[-1] = float(stop)
            reduce(ws, "grad", buf, functools.partial(self._add_grad, scale=1.0 / len(ws)), control=1)
            if float(buf[-1]) > 0:
                stop = True
                continue
            for w in [w for w in ws if w in self.replicas]:
                pr, rep = progress[w], self.replicas[w]
                pr.clock.start()
                rep.flat.grad.copy_(buf[:-1])
                self.before_write(w)
                rep.optimizer_step()
                pr.clock.stop()
        return stop

    def _add_grad(self, w: int, out: torch.Tensor, scale: float) -> None:
        out.add_(self.replicas[w].flat.grad, alpha=scale)

    def undo(self, starts: Mapping[int, torch.Tensor]) -> None:
        """An aborted round: every worker back to where it started it (``starts``), and, with ``snapshot``,
        to its inner state then."""
        self.progress = None
        for w, rep in self.replicas.items():
            if self.keep_snapshot and w in self._snap:
                rep.restore(self._snap[w])
            rep.load(starts[w])

    def before_write(self, w: int) -> None:
        """Worker w's optimizer is about to write its state: the round's snapshot must have been copied
        (on CUDA the copy runs behind the first step; this orders the write after it, no host wait)."""
        snap = self._snap.get(w)
        if snap is not None:
            snap.before_write()

    def left_out(self, bad: Sequence[int], r: int, in_a_row: int) -> None:
        """Round r + 1's non-finite workers (``bad``, all of them): this process's get a fresh inner
        optimizer; said once, with the bad rounds ``in_a_row``."""
        for w in bad:
            if w in self.replicas:
                self.replicas[w].reset_optimizer()
        if bad:
            log.warning(
                f"round {r + 1}: worker(s) {', '.join(map(str, bad))} produced a non-finite loss or update; "
                f"left out of the outer step ({in_a_row} bad round(s) in a row)"
            )

    @contextlib.contextmanager
    def holding(self, w: int, theta: torch.Tensor, start: torch.Tensor) -> Iterator[nn.Module]:
        """Worker w's model holding ``theta`` for the block; its ``start`` put back after when it differs."""
        rep, own = self.replicas[w], start is not theta
        if own:
            rep.load(theta)
        try:
            yield rep.model
        finally:
            if own:
                rep.load(start)

    def reset(self, w: int) -> None:
        """Worker w serves another trainer now: a fresh inner optimizer, and no error left by another
        trainer's Δ."""
        self.replicas[w].reset_optimizer()
        if self.feedback is not None:
            self.feedback[w].reset()

    def state(self, w: int) -> dict[str, torch.Tensor]:
        """Worker w's inner optimizer state and its error feedback (``feedback_error``) when kept."""
        out = self.replicas[w].inner_state()
        if self.feedback is not None and self.feedback[w].error is not None:
            out["feedback_error"] = self.feedback[w].state_dict()["error"]
        return out

    def load(
        self, w: int, inner: Mapping[str, torch.Tensor], scalars: Sequence[float] | None, b_max: int
    ) -> None:
        """Worker w's state back (:meth:`state`; a worker without one starts a fresh inner optimizer)."""
        inner = dict(inner)
        error = inner.pop("feedback_error", None)
        if self.feedback is not None:
            self.feedback[w].load_state_dict({} if error is None else {"error": error.to(self.device)})
        rep = self.replicas[w]
        rep.load_inner_state(inner)
        if scalars is not None:
            rep.load_scalars(scalars)
        rep.b_max = b_max


def gather(
    workers: Workers, comm: Comm, plans: Mapping[int, WorkerPlan], batch: AdaptiveBatch, abort: bool
) -> dict[int, WorkerRound]:
    """Phase 1 (ALGORITHM.md §6): every worker's scalars on every process, keyed by worker, with the stop
    requests (a request anywhere aborts the round everywhere). Counted are the values the batch test
    needs, when statistics are taken."""
    local = workers.rows(plans, batch, abort, comm.shards)
    counted = (WorkerRound.STATS + (batch.formula == "reference")) if batch.probing else 0
    rows = comm.all_gather_rows(local, WIDTH, "stats", counted)
    return {w: WorkerRound.from_row(rows[w]) for w in sorted(rows)}


def update_b_max(b_max: dict[int, int], results: Mapping[int, WorkerRound], r: int) -> None:
    """Every worker's b_max as it reported it (one that ran out of memory lowered its own)."""
    for w, res in results.items():
        if res.b_max != b_max[w]:
            log.warning(f"round {r + 1}: worker {w} ran out of memory; b_max {b_max[w]} -> {res.b_max}")
            b_max[w] = res.b_max


def update_speeds(speed: dict[int, float], results: Mapping[int, WorkerRound], fixed_rows: float) -> None:
    """Every worker's rows per second, a moving average (replicated: gathered numbers)."""
    for w, res in results.items():
        v = measured_speed(res, fixed_rows)
        if v > 0:
            speed[w] = v if w not in speed else 0.5 * v + 0.5 * speed[w]


def whole_worker(row: list[float], shards: Shards) -> list[float]:
    """A sharded worker's row from its ranks' (ALGORITHM.md §12): the loss is the mean of their weighted
    parts, the compute time the slowest rank's, a stop request or a non-finite shard anyone's, b_max the
    smallest; the statistics were summed over the shards already (the replica's)."""
    res = WorkerRound.from_row(row)
    total = shards.sum_(torch.tensor([res.loss], dtype=torch.float64))
    worst = shards.max_(
        torch.tensor(
            [res.compute_s, float(res.aborted), float(not res.finite), -res.b_max], dtype=torch.float64
        )
    )
    res.loss = float(total[0]) / shards.size
    res.compute_s, res.aborted, res.finite, res.b_max = (
        float(worst[0]),
        bool(worst[1]),
        not bool(worst[2]),
        int(-worst[3]),
    )
    return res.to_row()


def faults(
    r: int,
    members: Mapping[int, Sequence[int]],
    results: Mapping[int, WorkerRound],
    trainer_of: Mapping[int, int],
) -> tuple[list[events.Fault], list[int]]:
    """Round r + 1's non-finite workers (left out of the outer step and batch test; their inner state is
    to be reset) and trainers without a finite worker (skipped): the events, and the workers."""
    out: list[events.Fault] = []
    bad = [w for w in sorted(results) if not results[w].finite and results[w].steps > 0]
    for w in bad:
        out.append(
            events.Fault(
                round=r + 1,
                trainer=trainer_of[w],
                kind="non_finite",
                action="left out of the outer step; inner optimizer state reset",
                worker=w,
            )
        )
    for t in sorted(members):
        if members[t] and all(w in bad for w in members[t]):
            out.append(
                events.Fault(
                    round=r + 1,
                    trainer=t,
                    kind="trainer_skipped",
                    action="no finite worker: θ and request kept",
                )
            )
    return out, bad
