"""AdLoCo, DiLoCo, LocalSGD and DDP as objects for your own training loop (ALGORITHM.md §6).

An algorithm object is built from this process's worker replicas (your ``nn.Module`` and inner
optimizer; several for workers simulated in one process), a communicator, and the dials of
:mod:`adloco.settings`. It owns the rounds: the loop asks it how many rows the next step needs, hands it
the batch, and it runs the step (micro-batches, the gradient probe at the round's first step, clipping,
the inner optimizer). After H steps it synchronizes by itself (:meth:`AdLoCo.sync`), in the phases of
ALGORITHM.md §6, one method each:

  1. :meth:`~AdLoCo._gather`: every worker's scalars (statistics, losses, sizes) on every process, and
     where the batch test needs it each trainer's mean probe gradient (:meth:`~AdLoCo._shared_mean`);
  2. :meth:`~AdLoCo._outer_steps`: every trainer's outer step on Δ = Σ_m (n_m/n)(θ_t − θ_m);
  3. :meth:`~AdLoCo._batch_tests`: every trainer's batch test -> new requests;
  4. :meth:`~AdLoCo._maybe_merge`: every f rounds while K > 1, merge by policy, reallocate workers, send
     θ to moved workers;
  5. :meth:`~AdLoCo._next_round`: workers load their trainer's θ; totals, the report, the next plan.

Every vector collective goes through the communicator's one reducer (:meth:`adloco.comm.Comm.reduce`)
with the :class:`~adloco.settings.Wire` it travels as; every decision is a pure function of gathered
scalars, computed identically on every process, so no process is special. ``with algo:`` instead hooks
each replica's ``optimizer.step`` (:mod:`adloco.hooked`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from adloco import events
from adloco.algorithms import allocation, batching, merging, switch
from adloco.algorithms.outer import OuterOptimizer
from adloco.comm.base import Comm, Part
from adloco.comm.quantize import ErrorFeedback
from adloco.hooked import HookedMode
from adloco.replica import Batch, LossFn, Replica, n_rows
from adloco.round import (
    WIDTH,
    Clock,
    DecisionMismatch,
    RoundAborted,
    RoundReport,
    Totals,
    TrainerState,
    WorkerPlan,
    WorkerProgress,
    WorkerRound,
    plan_round,
    relative_speeds,
)
from adloco.settings import (
    FLOAT32,
    AdaptiveBatch,
    Balance,
    Dial,
    InnerState,
    Merging,
    OnResize,
    Outer,
    Precision,
    Switch,
    Wire,
    check_speeds,
    choice,
)
from adloco.state import AlgorithmState

__all__ = ["AdLoCo", "DecisionMismatch", "RoundAborted"]

log = logging.getLogger("adloco")


def _as_list(x: Any, what: str) -> list[Any]:
    if isinstance(x, (list, tuple)):
        if not x:
            raise ValueError(f"{what}: an empty list")
        return list(x)
    return [x]


def _dial(name: str, value: Any, cls: type[Dial]) -> Any:
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise ValueError(f"{name}: expected an {cls.__name__}(...) from adloco, got {value!r}")
    return value


class AdLoCo(HookedMode, AlgorithmState):
    """AdLoCo (arXiv 2508.18182): multi-instance training with trainer merging, adaptive batch sizes and
    switch mode, on DiLoCo rounds. DiLoCo, LocalSGD and DDP (:mod:`adloco.baselines`) are this class with
    parts turned off.

    Args:
        model: this process's worker replica(s): one ``nn.Module``, or a list for several workers in one
            process. Parameters must be float32; they move into a flat buffer (the objects stay).
        inner_optimizer: the optimizer of each replica (any ``torch.optim.Optimizer`` over all its
            parameters); its state persists across rounds.
        inner_steps: H, optimizer steps per round.
        trainers: K0, model instances at start (each gets at least one worker).
        comm: the communicator; default: torch.distributed's default group when it is initialized
            (``TorchDistComm``), else all workers in this process (``InProcessComm``).
        loss_fn: ``loss_fn(model, batch)`` -> the mean loss over the batch's rows; default
            ``model(**batch).loss``.
        outer, batch, merge, switch, wire: the dials (:mod:`adloco.settings`), each the config section of
            the same name (``wire`` is ``comm``); ``switch.b_max`` is every local worker's largest
            micro-batch (``set_b_max`` sets one per worker).
        clip: inner gradient clipping (global norm; 0 turns it off).
        precision: fp32, or bf16 / fp16 autocast on CUDA (fp16 with dynamic loss scaling).
        inner_state: keep (DiLoCo) or reset the inner optimizer every round (the reference).
        balance: equal gives every worker of a trainer its request b (bit for bit reproducible); speed
            shares each trainer's M·b examples per step among its workers by their measured speed, and
            workers among trainers by capacity (ALGORITHM.md §9.3): faster on uneven devices, but the run
            then depends on timings.
        emulate_speed: one factor in (0, 1] per worker (all of them, by id): worker w takes 1/s_w as long
            per step (it sleeps the difference): heterogeneous devices emulated on identical hardware.
        on_resize: loading the state of a run with another number of workers (ALGORITHM.md §9.2):
            per_trainer keeps each trainer's examples per step (b re-derived from M·b), per_worker keeps b.
        snapshot: keep the inner state at each round's start in host memory, so an aborted round is
            undone in place (``adloco train`` uses it to stop on a signal).
        sync_initial: broadcast each trainer's θ from its first worker to the others at construction
            (counted as ``init``); pass False when every process built identical replicas.
    """

    ddp = False  # DDP: gradients averaged every step instead of rounds of local steps

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        inner_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        *,
        inner_steps: int = 12,
        trainers: int = 4,
        comm: Comm | None = None,
        loss_fn: LossFn | None = None,
        outer: Outer | None = None,
        batch: AdaptiveBatch | None = None,
        merge: Merging | None = None,
        switch: Switch | None = None,
        wire: Wire | None = None,
        clip: float = 1.0,
        precision: Precision = "fp32",
        inner_state: InnerState = "keep",
        balance: Balance = "equal",
        emulate_speed: Sequence[float] | None = None,
        on_resize: OnResize = "per_trainer",
        snapshot: bool = False,
        sync_initial: bool = True,
    ) -> None:
        models = _as_list(model, "model")
        optimizers = _as_list(inner_optimizer, "inner_optimizer")
        if len(models) != len(optimizers):
            raise ValueError(
                f"inner_optimizer: {len(optimizers)} optimizer(s) for {len(models)} model(s); give one per model"
            )
        if not isinstance(inner_steps, int) or isinstance(inner_steps, bool) or inner_steps < 1:
            raise ValueError(
                f"inner_steps = {inner_steps!r}: must be an integer >= 1 (H counts optimizer steps)"
            )
        choice("balance", balance, Balance)
        choice("on_resize", on_resize, OnResize)
        choice("inner_state", inner_state, InnerState)
        self.balance, self.on_resize, self.inner_state = balance, on_resize, inner_state
        self.outer_spec = _dial("outer", outer, Outer)
        self.batch = _dial("batch", batch, AdaptiveBatch)
        self.merging = _dial("merge", merge, Merging)
        self.switch = _dial("switch", switch, Switch)
        self.wire = _dial("wire", wire, Wire)
        self.comm = comm if comm is not None else _default_comm(len(models))
        if len(self.comm.local_workers) != len(models):
            raise ValueError(
                f"model: {len(models)} replica(s) given, but the communicator hosts "
                f"{len(self.comm.local_workers)} worker(s) in this process"
            )
        n = self.comm.n_workers
        if not isinstance(trainers, int) or not 1 <= trainers <= n:
            raise ValueError(
                f"trainers = {trainers!r}: must be an integer in [1, {n}]: every trainer needs a worker (pass "
                "a list of models for several workers in one process, or run one process per worker)"
            )
        self.H = inner_steps
        self.emulate = check_speeds(emulate_speed or [], n, "emulate_speed") or None
        self.speed: dict[int, float] = {}  # measured examples per second of every worker (a moving average)
        self.membership: dict[str, Any] | None = None  # the last load_state_dict's change of workers
        self.keep_snapshot = snapshot
        self.counts_rows = True  # False in the hooked form when the rows of a step are unknown
        b_max = self.switch.b_max_or_default
        self.replicas: dict[int, Replica] = {
            w: Replica(m, o, loss_fn, clip=clip, precision=precision, b_max=b_max)
            for w, m, o in zip(self.comm.local_workers, models, optimizers, strict=True)
        }
        sizes = {r.flat.numel for r in self.replicas.values()}
        if len(sizes) != 1:
            raise ValueError(
                f"model: replicas of different sizes ({sorted(sizes)} parameters); all must match"
            )
        self.n_params = sizes.pop()
        # error feedback of each local worker's Δ (reset when it moves; in its state dict)
        self.feedback: dict[int, ErrorFeedback] | None = (
            {w: ErrorFeedback() for w in self.replicas}
            if self.wire.error_feedback and self.wire.compressed
            else None
        )
        self.device = next(iter(self.replicas.values())).device

        # Replicated state: identical on every process.
        self.round = 0  # rounds completed
        self.trainers: dict[int, TrainerState] = {
            t: TrainerState(t, self.batch.initial, self._new_outer()) for t in range(trainers)
        }
        self.allocation = allocation.allocate(self.requests, n, mode=self.merging.allocation)
        self.b_max = self._agree({w: [b_max] for w in self.replicas})
        self.bad_rounds = 0
        self.totals = Totals()
        self.last_report: RoundReport | None = None

        # Heavy state: θ of the trainers this process hosts, taken from their first local worker.
        self.scratch = torch.zeros(self.n_params, device=self.device)
        self.scratch2 = torch.zeros(self.n_params, device=self.device)
        for t, ws in self.members().items():
            mine = self._local(ws)
            if mine:
                self.trainers[t].theta = self.replicas[mine[0]].flat.param.detach().clone()
        if sync_initial and n > 1:
            for t, ws in sorted(self.members().items()):
                tr = self.trainers[t]
                self.comm.broadcast(tr.theta if tr.theta is not None else self.scratch, ws[0], ws, "init")
            self._collect()
        for w, rep in self.replicas.items():
            rep.load(self.theta(self.allocation[w]))
        if (
            self.batch.estimator == "paper"
            and self.batch.probing
            and min(map(len, self.members().values())) < 2
        ):
            log.warning(
                "batch estimator 'paper' needs two or more workers per trainer: a trainer with one worker "
                "keeps its request until a merge gives it more (the pooled estimator has no such limit)"
            )
        self._h = 0  # inner steps done in the current round
        self._hooks: list[Any] = []
        self._snap: dict[int, tuple[dict[str, torch.Tensor], list[float]]] = {}
        self._progress: dict[int, WorkerProgress] | None = None
        self._ddp_buf: torch.Tensor | None = None  # DDP's gradients and its stop request, one buffer
        self._plan()

    # -- replicated state --------------------------------------------------------------------------
    @property
    def requests(self) -> dict[int, int]:
        return {t: tr.request for t, tr in sorted(self.trainers.items())}

    @property
    def alive(self) -> list[int]:
        return sorted(self.trainers)

    @property
    def local_workers(self) -> list[int]:
        return sorted(self.replicas)

    def members(self) -> dict[int, list[int]]:
        return allocation.members(self.allocation)

    def theta(self, t: int) -> torch.Tensor:
        theta = self.trainers[t].theta
        if theta is None:
            raise ValueError(f"trainer {t}: not hosted by this process (no worker of it lives here)")
        return theta

    def model_of(self, t: int) -> nn.Module | None:
        """A local model holding trainer t's θ between rounds (its first local worker's), or None."""
        mine = self._local(self.members().get(t, []))
        return self.replicas[mine[0]].model if mine else None

    @property
    def plan(self) -> WorkerPlan:
        """This round's plan of the only local worker."""
        return self.plans[self._only()]

    def batch_size(self, worker: int | None = None) -> int:
        """Rows the next inner step of ``worker`` (default: the only local worker) needs."""
        w = self._only() if worker is None else worker
        return self.plans[w].rows(self._h)

    @property
    def step_in_round(self) -> int:
        return self._h

    def _only(self) -> int:
        if len(self.replicas) != 1:
            raise ValueError(
                f"this process hosts {len(self.replicas)} workers: name one (batch_size(worker=...)) or use "
                "step_all({worker: batch})"
            )
        return next(iter(self.replicas))

    def _local(self, workers: Sequence[int]) -> list[int]:
        return [w for w in workers if w in self.replicas]

    def _new_outer(self) -> OuterOptimizer:
        o = self.outer_spec
        return OuterOptimizer(o.optimizer, o.lr, o.momentum)

    def _agree(self, local: Mapping[int, Sequence[float]]) -> dict[int, int]:
        got = self.comm.all_gather_rows(local, 1, "check", counted=0)
        return {w: int(v[0]) for w, v in got.items()}

    def set_b_max(self, local: Mapping[int, int]) -> None:
        """Every process's workers' b_max (for example from a memory search), agreed by a gather; the
        current round's plan is remade. Call it on every process, between rounds."""
        if self._h:
            raise RuntimeError("set_b_max: only between rounds")
        for w, b in local.items():
            self.replicas[w].b_max = int(b)
        self.b_max = self._agree({w: [self.replicas[w].b_max] for w in self.replicas})
        self._plan()

    # -- the plan ----------------------------------------------------------------------------------
    def _plan(self) -> None:
        """This round's plan for every local worker (computed alike everywhere: it needs the others')."""
        self.mode = switch.mode_for(self.switch.schedule, self.switch.mode, len(self.trainers))
        members = self.members()
        speeds = {t: self._relative_speeds(ws) for t, ws in members.items()}
        every = plan_round(self.requests, members, self.b_max, self.mode, self.switch, self.batch, speeds)
        self.plans = {w: p for w, p in every.items() if w in self.replicas}

    def _relative_speeds(self, workers: Sequence[int]) -> dict[int, float] | None:
        """Shares by measured speed (:func:`adloco.round.relative_speeds`), or None for equal shares: with
        balance equal; for DDP (its gradients are averaged with equal weights) and the paper estimator (its
        samples are whole steps of one size); and when every worker runs on this process's one device with
        nothing emulated (their speeds differ by noise alone)."""
        if self.balance == "equal" or self.ddp or self.batch.estimator == "paper":
            return None
        if self.emulate is None and self.comm.one_device:
            return None
        return relative_speeds(self.speed, workers)

    # -- inner steps -------------------------------------------------------------------------------
    def _round_progress(self) -> dict[int, WorkerProgress]:
        """This round's bookkeeping, begun (inner state reset, snapshot) before its first step."""
        if self._progress is None:
            for w, rep in self.replicas.items():
                if self.inner_state == "reset":
                    rep.reset_optimizer()
                if self.keep_snapshot:
                    self._snap[w] = (
                        {k: v.to("cpu", copy=True) for k, v in rep.inner_state().items()},
                        rep.scalars(),
                    )
            self._progress = {
                w: WorkerProgress(Clock(self.device), skipped_before=rep.skipped)
                for w, rep in self.replicas.items()
            }
        return self._progress

    def step(self, batch: Batch, *, stop: bool = False) -> torch.Tensor:
        """One inner step of the only local worker on ``batch`` (``batch_size()`` rows); returns its mean
        loss (a 0-dim tensor, not synchronized). The H-th step of a round also synchronizes (``sync``)."""
        return self.step_all({self._only(): batch}, stop=stop)[self._only()]

    def step_all(self, batches: Mapping[int, Batch], *, stop: bool = False) -> dict[int, torch.Tensor]:
        """One inner step of every local worker, ``batches[w]`` holding ``batch_size(w)`` rows.

        ``stop``: this process wants to end the round now (a signal, say); the round is aborted on every
        process (:class:`RoundAborted`, raised once all of them got there), and with ``snapshot`` undone.
        """
        if self._hooks:
            raise RuntimeError("step_all: the optimizer hooks are active (inside `with algo:`); use one mode")
        if set(batches) != set(self.replicas):
            raise ValueError(
                f"batches: keyed by workers {sorted(batches)}; this process hosts {self.local_workers}"
            )
        h = self._h
        progress = self._round_progress()
        if stop and not self.ddp:
            self.sync(abort=True)
        losses: dict[int, torch.Tensor] = {}
        for w in self.local_workers:
            plan, rep, pr = self.plans[w], self.replicas[w], progress[w]
            got = n_rows(batches[w])
            if got != plan.rows(h):
                raise ValueError(
                    f"batch of worker {w}: {got} rows; step {h} of this round needs {plan.rows(h)} "
                    "(batch_size() says how many)"
                )
            probe = plan.probe if h == 0 else None
            pr.clock.start()
            loss, stats = rep.gradient(batches[w], plan.effective, plan.micro, probe, self.scratch)
            if not self.ddp:  # DDP steps once the trainer's gradients are averaged
                rep.optimizer_step()
            if self.emulate is not None:
                pr.clock.stretch(self.emulate[w])
            pr.clock.stop()
            if stats is not None:
                pr.stats = stats
            if probe is not None and probe.extra:
                pr.probe_examples += probe.extra_rows
            pr.loss = loss if pr.loss is None else pr.loss + loss
            pr.steps += 1
            pr.examples += plan.effective
            losses[w] = loss
        if self.ddp:
            self._ddp_step(stop)
        self._h += 1
        if self._h == self.H:
            self.sync()
        return losses

    def _ddp_step(self, stop: bool) -> None:
        """Synchronous data parallel: every trainer's workers average their gradients (one reduction of P
        values, counted as ``grad``) and take the same step. A stop request rides along as control, so
        every worker of a trainer stops at the same step."""
        if self._ddp_buf is None:
            self._ddp_buf = torch.empty(self.n_params + 1, device=self.device)
        buf = self._ddp_buf
        members = self.members()
        progress = self._round_progress()
        for t in self.alive:
            ws = members[t]
            buf[-1] = float(stop)
            self._reduce(ws, "grad", buf, functools.partial(self._add_grad, scale=1.0 / len(ws)), control=1)
            if float(buf[-1]) > 0:
                stop = True
                continue
            for w in self._local(ws):
                pr, rep = progress[w], self.replicas[w]
                pr.clock.start()
                rep.flat.grad.copy_(buf[:-1])
                rep.optimizer_step()
                pr.clock.stop()
        if stop:
            self.sync(abort=True)

    def _reduce(
        self,
        workers: Sequence[int],
        kind: str,
        out: torch.Tensor,
        add: Callable[[int, torch.Tensor], None],
        wire: Wire | None = None,
        feedback: Mapping[int, ErrorFeedback] | None = None,
        control: int = 0,
    ) -> bool:
        """The communicator's reducer over ``workers`` with this process's of them as the parts, each
        ``add(w, buffer)``; on the round's wire unless told otherwise."""
        parts: dict[int, Part] = {w: functools.partial(add, w) for w in self._local(workers)}
        return self.comm.reduce(
            parts, workers, kind, out, self.wire if wire is None else wire, feedback, control
        )

    # -- the synchronization -----------------------------------------------------------------------
    def sync(self, abort: bool = False) -> RoundReport:
        """End the round on every process, phase by phase (see the module docstring); returns its report.

        Called by the H-th step; call it yourself only to end a round early. ``abort``: undo it instead
        (every process raises :class:`RoundAborted`)."""
        members = self.members()
        trainer_of = dict(self.allocation)
        results, fault_events = self._gather(abort, members)  # 1.
        ok = {t: [w for w in members[t] if results[w].finite] for t in self.alive}
        stats = {w: res.stats for w, res in results.items()}
        self._outer_steps(members, ok, results)  # 2.
        trainer_events = self._batch_tests(members, ok, results, stats)  # 3.
        merge_event, alloc_event = self._maybe_merge(members)  # 4.
        return self._next_round(
            results, trainer_of, trainer_events, fault_events, merge_event, alloc_event
        )  # 5.

    def _gather(
        self, abort: bool, members: dict[int, list[int]]
    ) -> tuple[dict[int, WorkerRound], list[events.Fault]]:
        """Phase 1: every worker's scalars on every process (with stop requests: a request anywhere aborts
        the round everywhere), out-of-memory b_max changes, measured speeds, and non-finite workers."""
        progress = self._round_progress()
        b, r, plans = self.batch, self.round, self.plans
        local: dict[int, list[float]] = {}
        for w, rep in self.replicas.items():
            pr = progress[w]
            st = pr.stats
            if b.estimator == "paper" and b.probing and pr.steps:  # the last gradient, unclipped: c = e
                sq, entries = rep.last_gradient()
                st = batching.WorkerStats(1, plans[w].effective, sq, sq, sum_entries=entries)
            mean = (pr.loss / pr.steps).item() if pr.steps and pr.loss is not None else math.nan
            finite = pr.steps > 0 and (math.isfinite(mean) or pr.loss is None) and rep.finite()
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
            ).to_row()
        counted = (WorkerRound.STATS + (b.formula == "reference")) if b.probing else 0
        rows = self.comm.all_gather_rows(local, WIDTH, "stats", counted)
        results = {w: WorkerRound.from_row(rows[w]) for w in sorted(rows)}
        if any(res.aborted for res in results.values()):
            self._undo()
            raise RoundAborted(r + 1)
        self._h = 0
        self._progress = None
        for w, res in results.items():
            if res.b_max != self.b_max[w]:
                log.warning(
                    f"round {r + 1}: worker {w} ran out of memory; b_max {self.b_max[w]} -> {res.b_max}"
                )
                self.b_max[w] = res.b_max
        for w, res in results.items():  # examples per second, a moving average (replicated: gathered numbers)
            if res.compute_s > 0 and res.examples > 0:
                v = (res.examples + res.probe_examples) / res.compute_s
                self.speed[w] = v if w not in self.speed else 0.5 * v + 0.5 * self.speed[w]
        return results, self._faults(r, members, results)

    def _outer_steps(
        self, members: dict[int, list[int]], ok: dict[int, list[int]], results: dict[int, WorkerRound]
    ) -> None:
        """Phase 2: every trainer's outer step on Δ_t = Σ_m (n_m / n)(θ_t − θ_m), over its finite workers.
        The pseudo-gradients, not the parameters, are reduced, so a compressed wire keeps them."""
        for t in self.alive:
            ws = ok[t]
            if not ws:
                continue
            tr = self.trainers[t]
            if self.ddp:  # the workers stepped together on averaged gradients: θ is any of theirs
                mine = self._local(ws)
                if mine and tr.theta is not None:
                    tr.theta.copy_(self.replicas[mine[0]].flat.param)
                continue
            n_ex = sum(results[w].examples for w in ws)

            def add_delta(w: int, out: torch.Tensor, t: int = t, n_ex: int = n_ex) -> None:
                torch.sub(self.theta(t), self.replicas[w].flat.param, out=self.scratch2)  # θ_t − θ_m
                out.add_(self.scratch2, alpha=results[w].examples / n_ex)

            buf = self.scratch
            self._reduce(ws, "delta", buf, add_delta, feedback=self.feedback)
            if len(ws) < len(members[t]):
                # a worker left out still serves t: its process (possibly hosting no finite worker of t,
                # hence outside the reduction) needs Δ_t too, or its θ_t and momentum go stale
                self.comm.broadcast(buf, ws[0], members[t], "delta")
            if tr.theta is not None:
                with torch.no_grad():
                    tr.outer.step(tr.theta, buf)

    def _batch_tests(
        self,
        members: dict[int, list[int]],
        ok: dict[int, list[int]],
        results: dict[int, WorkerRound],
        stats: dict[int, batching.WorkerStats | None],
    ) -> list[events.Trainer]:
        """Phase 3: every trainer's batch test on its finite workers' pooled statistics -> new requests."""
        b, r = self.batch, self.round
        shared = b.probing and batching.needs_shared_mean(b.test, b.estimator, b.exact_mean)
        need_p = b.test in ("inner_product", "augmented_inner_product")
        gbar_sq, dots = self._shared_mean(ok, stats, need_p) if shared else ({}, {})
        out = []
        for t in self.alive:
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
            tr = self.trainers[t]
            dec = batching.decide(
                tr.request,
                b.test,
                pooled,
                cap=b.max,
                eta=b.eta,
                vartheta=b.vartheta,
                nu=b.nu,
                formula=b.formula,
            )
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
                    examples=n_ex if self.counts_rows else None,
                )
            )
            tr.request = dec.request
        return out

    def _shared_mean(
        self, members: dict[int, list[int]], stats: dict[int, batching.WorkerStats | None], need_p: bool
    ) -> tuple[dict[int, float], dict[int, dict[int, tuple[float, float]]]]:
        """Reduce every trainer's mean probe gradient ḡ (P values) among its workers; returns ‖ḡ‖² per
        trainer and, for the inner-product tests, every worker's (Σ_j <g_j, ḡ>, Σ_j <g_j, ḡ>²).

        Only processes hosting a worker of trainer t see its ḡ, so ‖ḡ‖² and the dot products travel in
        the scalar gather that follows: every process must decide every request from the same numbers.
        """
        paper = self.batch.estimator == "paper"
        rows: dict[int, list[float]] = {w: [math.nan, math.nan, math.nan] for w in self.replicas}
        pooled: list[int] = []
        for t in self.alive:
            got = [stats[w] for w in members[t]]
            if not got or any(s is None for s in got) or len({s.c for s in got if s}) != 1:
                continue
            pooled.append(t)
            n_t = sum(s.n for s in got if s)
            buf = self.scratch
            self._reduce(members[t], "probe", buf, functools.partial(self._add_sample_sum, paper=paper))
            gbar = buf.div_(n_t)  # ḡ: (P,)
            g2 = float(torch.dot(gbar, gbar))
            for w in self._local(members[t]):
                rows[w][0] = g2
                if need_p:
                    p = self.replicas[w].sample_dots(gbar, paper)  # (k,)
                    rows[w][1:] = [float(p.sum()), float((p * p).sum())]
        gathered = self.comm.all_gather_rows(rows, 3, "stats", counted=3 if need_p else 1)
        dots = (
            {t: {w: (gathered[w][1], gathered[w][2]) for w in members[t]} for t in pooled} if need_p else {}
        )
        return {t: gathered[members[t][0]][0] for t in pooled}, dots

    def _add_grad(self, w: int, out: torch.Tensor, scale: float) -> None:
        out.add_(self.replicas[w].flat.grad, alpha=scale)

    def _add_sample_sum(self, w: int, out: torch.Tensor, paper: bool) -> None:
        self.replicas[w].add_sample_sum(out, paper)

    def _maybe_merge(
        self, members: dict[int, list[int]]
    ) -> tuple[events.Merge | None, events.Allocation | None]:
        """Phase 4: every f rounds while K > 1, merge the trainers the policy selects into the lowest id
        (θ and the outer momentum weighted by requests), then share the workers again and move those that
        change trainer (ALGORITHM.md §3–4)."""
        m, r = self.merging, self.round
        if m.policy == "none" or len(self.trainers) < 2 or (r + 1) % m.every != 0:
            return None, None
        S = merging.select(self.requests, m.policy, m.size)
        if len(S) < 2:
            return None, None
        w = merging.weights(self.requests, S)
        keep = merging.survivor(S)
        union = sorted(x for t in S for x in members[t])
        # θ_r = Σ_{j∈S} w_j θ_j, and the outer momentum alike: a trainer's part is added by its first
        # worker's process, so the sum over the union's processes counts every trainer exactly once.
        led = {members[t][0]: t for t in S if members[t][0] in self.replicas}
        merged: dict[str, torch.Tensor] = {}
        for name in ("theta", "momentum") if self._new_outer().has_state else ("theta",):

            def add(x: int, out: torch.Tensor, name: str = name) -> None:
                tr = self.trainers[led[x]]
                value = tr.theta if name == "theta" else tr.momentum()
                if value is not None:
                    out.add_(value, alpha=w[led[x]])

            buf = torch.empty_like(self.scratch)
            parts: dict[int, Part] = {x: functools.partial(add, x) for x in sorted(led, key=lambda x: led[x])}
            self.comm.reduce(parts, union, "merge", buf, FLOAT32)
            merged[name] = buf
        survivor = self.trainers[keep]
        if any(x in self.replicas for x in union):
            survivor.theta = merged["theta"]
            survivor.outer = self._new_outer()
            if "momentum" in merged:
                survivor.outer.load_state_dict({"momentum": merged["momentum"]})
        survivor.request = merging.merged_request(self.requests, S, m.survivor_batch, keep)
        for t in S:
            if t != keep:
                del self.trainers[t]
        merge_event = events.Merge(
            round=r + 1,
            merged=S,
            survivor=keep,
            weights=w,
            request=survivor.request,
            trainers_alive=len(self.trainers),
        )
        # Reallocate: the workers of merged trainers already hold the survivor's θ.
        current = {x: (keep if t in S else t) for x, t in self.allocation.items()}
        speeds = self._relative_speeds(sorted(self.allocation))
        if speeds is not None and m.allocation == "requests":  # by capacity: shares of the total speed
            new = allocation.by_capacity(self.requests, speeds, current)
        else:
            new = allocation.allocate(self.requests, self.comm.n_workers, current, m.allocation)
        moved, changed = self._move(current, new)
        return merge_event, events.Allocation(round=r + 1, allocation=new, moved=moved, reset=changed)

    def _move(self, current: dict[int, int], new: dict[int, int]) -> tuple[list[int], list[int]]:
        """Send θ (and the outer momentum: every process of a trainer replicates the outer step) to
        workers that change trainer; reset their inner optimizers; drop state no longer hosted."""
        holders = allocation.members(current)
        moved = [x for x in sorted(new) if new[x] != current[x]]
        for x in moved:
            tr = self.trainers[new[x]]
            src = holders[tr.id][0]
            if x in self.replicas and not tr.hosted:  # this process receives a trainer it did not host
                tr.theta = torch.zeros_like(self.scratch)
            self.comm.broadcast(tr.theta if tr.theta is not None else self.scratch, src, [src, x], "move")
            if tr.outer.has_state:
                momentum = tr.momentum()
                self.comm.broadcast(momentum if momentum is not None else self.scratch, src, [src, x], "move")
        changed = [x for x in sorted(new) if new[x] != self.allocation[x]]
        for x in changed:
            if x in self.replicas:
                self.replicas[x].reset_optimizer()
                if self.feedback is not None:  # its error belonged to another trainer's Δ
                    self.feedback[x].reset()
        self.allocation = new
        hosted = {new[x] for x in self.replicas}
        for t, tr in self.trainers.items():
            if t not in hosted:  # keep heavy state only where a worker of the trainer lives
                tr.theta = None
                tr.outer = self._new_outer()
        return moved, changed

    def _next_round(
        self,
        results: dict[int, WorkerRound],
        trainer_of: dict[int, int],
        trainer_events: list[events.Trainer],
        fault_events: list[events.Fault],
        merge_event: events.Merge | None,
        alloc_event: events.Allocation | None,
    ) -> RoundReport:
        """Phase 5: workers load their trainer's θ; the round counted (examples, bytes), its decisions
        checked for agreement, the next round planned, and the report made."""
        for w, rep in self.replicas.items():
            rep.load(self.theta(self.allocation[w]))
        # training examples read: the steps' and the probe's extra rows (a budget counts both)
        examples = sum(res.examples + res.probe_examples for res in results.values())
        if self.counts_rows and self.totals.examples is not None:
            self.totals.examples += examples
        else:  # the hooked mode without a batch size: the rows of a step were never seen
            self.totals.examples = None
        self.round += 1
        self._check_agreement()
        nbytes, msgs, comm_s, collectives = self._collect()
        self._plan()
        known = self.counts_rows
        worker_events = [
            events.Worker(
                round=self.round,
                worker=w,
                trainer=trainer_of[w],
                loss=events.num(res.loss),
                examples=res.examples if known else None,
                probe_examples=res.probe_examples,
                micro=res.micro,
                accum=res.accum,
                effective=res.micro * res.accum,
                capped=res.capped,
                finite=res.finite,
                compute_s=res.compute_s,
                skipped=res.skipped,
            )
            for w, res in results.items()
        ]
        stepped = sum(res.examples for res in results.values())
        total_loss = sum(res.loss * res.examples for res in results.values())
        self.last_report = RoundReport(
            round=self.round,
            workers=worker_events,
            trainers=trainer_events,
            faults=fault_events,
            merge=merge_event,
            allocation=alloc_event,
            switch_mode=self.mode,
            examples=examples if known else None,
            loss=events.num(total_loss / max(stepped, 1)),
            bytes=nbytes,
            messages=msgs,
            comm_s=comm_s,
            collectives=collectives,
            compute_s={w: res.compute_s for w, res in results.items()},
            idle_share=sum(e.idle_share for e in trainer_events) / max(len(trainer_events), 1),
        )
        return self.last_report

    def _undo(self) -> None:
        """An aborted round: workers back to θ (and, with ``snapshot``, their inner state) at its start."""
        self._h = 0
        self._progress = None
        for w, rep in self.replicas.items():
            if self.keep_snapshot and w in self._snap:
                state, scalars = self._snap[w]
                rep.load_inner_state(state)
                rep.load_scalars(scalars)
            rep.load(self.theta(self.allocation[w]))
        self.comm.drain()

    def _faults(
        self, r: int, members: dict[int, list[int]], results: dict[int, WorkerRound]
    ) -> list[events.Fault]:
        """Non-finite workers: left out of the outer step and batch test, inner state reset, counted."""
        out: list[events.Fault] = []
        bad = [w for w in sorted(results) if not results[w].finite and results[w].steps > 0]
        self.bad_rounds = self.bad_rounds + 1 if bad else 0
        for w in bad:
            out.append(
                events.Fault(
                    round=r + 1,
                    trainer=self.allocation[w],
                    kind="non_finite",
                    action="left out of the outer step; inner optimizer state reset",
                    worker=w,
                )
            )
            if w in self.replicas:
                self.replicas[w].reset_optimizer()
        for t in self.alive:
            if members[t] and all(w in bad for w in members[t]):
                out.append(
                    events.Fault(
                        round=r + 1,
                        trainer=t,
                        kind="trainer_skipped",
                        action="no finite worker: θ and request kept",
                    )
                )
        if bad:
            log.warning(
                f"round {r + 1}: worker(s) {', '.join(map(str, bad))} produced a non-finite loss or update; "
                f"left out of the outer step ({self.bad_rounds} bad round(s) in a row)"
            )
        return out

    def _collect(self) -> tuple[int, int, float, list[list[Any]]]:
        """(bytes, messages, seconds in counted collectives, [kind, op, n, payload, count] rows) since the
        last call; added to the totals. The rows are what the network model prices (simulated time)."""
        recs = self.comm.drain()
        nbytes = sum(r.wire for r in recs)
        msgs = sum(1 for r in recs if r.workers > 1)
        self.totals.bytes += nbytes
        self.totals.messages += msgs
        counts: dict[tuple[str, str, int, int], int] = {}
        for rec in recs:
            self.totals.by_kind[rec.kind] = self.totals.by_kind.get(rec.kind, 0) + rec.wire
            if rec.workers > 1:
                key = (rec.kind, rec.op, rec.workers, rec.payload)
                counts[key] = counts.get(key, 0) + 1
        return nbytes, msgs, sum(r.seconds for r in recs), [[*k, c] for k, c in counts.items()]

    def _check_agreement(self) -> None:
        """Every process must have made the same decisions; compare a hash of them (not counted)."""
        state = [self.round, self.requests, sorted(self.allocation.items())]
        digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
        h = float(int(digest[:13], 16))  # 52 bits: exact in a float64
        got = self.comm.all_gather_rows({w: [h] for w in self.replicas}, 1, "check", counted=0)
        ranks: dict[float, set[int]] = {}
        for w, (v,) in got.items():
            ranks.setdefault(v, set()).add(self.comm.owner(w))
        if len(ranks) > 1:
            groups = " vs ".join("ranks " + ",".join(map(str, sorted(x))) for x in ranks.values())
            raise DecisionMismatch(
                f"round {self.round}: processes disagree on requests, merges or allocation ({groups}); "
                "this is a bug or non-deterministic arithmetic, please report it with the run directory"
            )


def _default_comm(n_local: int) -> Comm:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from adloco.comm.torchdist import TorchDistComm

        return TorchDistComm(n_local)
    from adloco.comm.inprocess import InProcessComm

    return InProcessComm(n_local)
