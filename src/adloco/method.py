"""AdLoCo, DiLoCo, LocalSGD and DDP as objects for your own training loop (ALGORITHM.md §6).

An algorithm object is built from this process's worker replicas (your ``nn.Module`` and inner
optimizer; several for workers simulated in one process), a communicator, and the dials of
:mod:`adloco.settings`. It owns the rounds: the loop asks it how many rows the next step needs, hands it
the batch, and it runs the step (micro-batches, the gradient probe at the round's common point,
clipping, the inner optimizer). After H steps it synchronizes by itself (``sync``):

  1. every worker's scalars are gathered (statistics, losses, sizes); where the batch test needs it,
     each trainer's mean probe gradient is all-reduced;
  2. every trainer's outer step: one all-reduce of Δ = Σ_m (n_m/n)(θ_t − θ_m) among its workers;
  3. every trainer's batch test -> new requests;
  4. every f rounds while K > 1: merge by policy, reallocate workers, send θ to moved workers;
  5. workers load their trainer's θ; the next round's plan is made.

Every decision is a pure function of gathered scalars, computed identically on every process, so no
process is special. ``with algo:`` instead hooks each replica's ``optimizer.step`` (your loop does the
forward and backward, as with torchft's DiLoCo); that mode has no gradient probe, so it suits DiLoCo,
LocalSGD, DDP and AdLoCo without a batch test.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from adloco import events
from adloco.algorithms import allocation, batching, merging, switch
from adloco.algorithms.outer import OuterOptimizer
from adloco.comm.base import Comm
from adloco.comm.quantize import ErrorFeedback
from adloco.replica import Batch, LossFn, Probe, Replica, n_rows
from adloco.round import (
    WIDTH,
    DecisionMismatch,
    RoundAborted,
    RoundReport,
    Totals,
    TrainerState,
    WorkerPlan,
    WorkerRound,
    _Clock,
    _Progress,
)
from adloco.settings import AdaptiveBatch, Merging, Outer, Switch
from adloco.state import Stateful

log = logging.getLogger("adloco")
WIRE = ("float32", "bfloat16", "float16", "int8", "int4")


def _as_list(x: Any, what: str) -> list[Any]:
    if isinstance(x, (list, tuple)):
        if not x:
            raise ValueError(f"{what}: an empty list")
        return list(x)
    return [x]


class AdLoCo(Stateful):
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
        outer, batch, merge, switch: the dials (:mod:`adloco.settings`).
        loss_fn: ``loss_fn(model, batch)`` -> the mean loss over the batch's rows; default
            ``model(**batch).loss``.
        b_max: the largest micro-batch of a worker (an int, or {worker: int} for this process's workers).
        clip: inner gradient clipping (global norm; 0 turns it off).
        precision: fp32, or bf16 / fp16 autocast on CUDA (fp16 with dynamic loss scaling).
        inner_state: keep (DiLoCo) or reset the inner optimizer every round (the reference).
        wire_dtype: what is all-reduced every round (Δ, probe gradients, DDP gradients) travels as:
            float32, or through the compressed all-reduce (bfloat16, float16, int8, int4: block-wise
            absmax quantization in blocks of ``wire_block`` values; :mod:`adloco.comm.compressed`).
        error_feedback: each worker adds what quantization dropped from its Δ to its next round's Δ.
        ddp: average gradients every step (synchronous data parallel) instead of rounds of local steps.
        sync_initial: broadcast each trainer's θ from its first worker to the others at construction
            (counted as ``init``); pass False when every process built identical replicas.
        snapshot: keep the inner state at each round's start in host memory, so an aborted round is
            undone in place (``adloco train`` uses it to stop on a signal).
        on_resize: loading the state of a run with another number of workers (ALGORITHM.md §9.2): per_trainer
            keeps each trainer's examples per step (b re-derived from M·b), per_worker keeps b.
        balance: speed shares each trainer's M·b examples per step among its workers by their measured
            speed, and workers among trainers by capacity (ALGORITHM.md §9.3); equal gives every worker b.
        emulate_speed: one factor per worker (all of them, by id): worker w takes 1/s_w as long per step
            (it sleeps the difference): heterogeneous devices emulated on identical hardware.
    """

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        inner_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        *,
        inner_steps: int,
        trainers: int = 4,
        comm: Comm | None = None,
        outer: Outer | None = None,
        batch: AdaptiveBatch | None = None,
        merge: Merging | None = None,
        switch: Switch | None = None,
        loss_fn: LossFn | None = None,
        b_max: int | Mapping[int, int] = 8,
        clip: float = 1.0,
        precision: str = "fp32",
        inner_state: str = "keep",
        wire_dtype: str = "float32",
        wire_block: int = 256,
        error_feedback: bool = False,
        ddp: bool = False,
        sync_initial: bool = True,
        snapshot: bool = False,
        on_resize: str = "per_trainer",
        balance: str = "speed",
        emulate_speed: Sequence[float] | None = None,
    ) -> None:
        models = _as_list(model, "model")
        optimizers = _as_list(inner_optimizer, "inner_optimizer")
        if len(models) != len(optimizers):
            raise ValueError(
                f"inner_optimizer: {len(optimizers)} optimizer(s) for {len(models)} model(s); give one per model"
            )
        if not isinstance(inner_steps, int) or inner_steps < 1:
            raise ValueError(
                f"inner_steps: {inner_steps!r} must be an integer >= 1 (H counts optimizer steps)"
            )
        if balance not in ("speed", "equal"):
            raise ValueError(f"balance: {balance!r} is not one of speed | equal")
        self.balance = balance
        if on_resize not in ("per_trainer", "per_worker"):
            raise ValueError(f"on_resize: {on_resize!r} is not one of per_trainer | per_worker")
        self.on_resize = on_resize
        self.membership: dict[str, Any] | None = None  # the last load_state_dict's change of workers
        if inner_state not in ("keep", "reset"):
            raise ValueError(f"inner_state: {inner_state!r} is not one of keep | reset")
        if wire_dtype not in WIRE:
            raise ValueError(f"wire_dtype: {wire_dtype!r} is not one of {' | '.join(WIRE)}")
        if not isinstance(wire_block, int) or wire_block < 1:
            raise ValueError(f"wire_block: {wire_block!r} must be an integer >= 1 (values per scale)")
        self.comm = comm if comm is not None else _default_comm(len(models))
        if len(self.comm.local_workers) != len(models):
            raise ValueError(
                f"model: {len(models)} replica(s) given, but the communicator hosts "
                f"{len(self.comm.local_workers)} worker(s) in this process"
            )
        n = self.comm.n_workers
        if not isinstance(trainers, int) or not 1 <= trainers <= n:
            raise ValueError(
                f"trainers: {trainers!r} must be an integer in [1, {n}] (every trainer needs a worker)"
            )
        self.H = inner_steps
        if emulate_speed is not None and (
            len(emulate_speed) != self.comm.n_workers or not all(0 < x <= 1e6 for x in emulate_speed)
        ):
            raise ValueError(
                f"emulate_speed: {list(emulate_speed)!r} must hold {self.comm.n_workers} positive numbers (one per worker)"
            )
        self.emulate = list(emulate_speed) if emulate_speed else None
        self.speed: dict[int, float] = {}  # measured examples per second of every worker (a moving average)
        self.outer_spec = _setting("outer", outer, Outer)
        self.batch = _setting("batch", batch, AdaptiveBatch)
        self.merging = _setting("merge", merge, Merging)
        self.switch = _setting("switch", switch, Switch)
        self.ddp = ddp
        self.inner_state = inner_state
        self.wire, self.wire_block = wire_dtype, wire_block
        self.keep_snapshot = snapshot
        if isinstance(b_max, Mapping):
            local_b = {w: int(b_max[w]) for w in self.comm.local_workers}
        else:
            local_b = dict.fromkeys(self.comm.local_workers, int(b_max))
        if any(b < 1 for b in local_b.values()):
            raise ValueError(f"b_max: {b_max!r} must be >= 1")
        self.replicas: dict[int, Replica] = {
            w: Replica(m, o, loss_fn, clip=clip, precision=precision, b_max=local_b[w])
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
            if error_feedback and wire_dtype != "float32"
            else None
        )
        self.device = next(iter(self.replicas.values())).device

        # Replicated state: identical on every process.
        self.round = 0  # rounds completed
        self.trainers: dict[int, TrainerState] = {
            t: TrainerState(t, self.batch.initial, self._new_outer()) for t in range(trainers)
        }
        self.allocation = allocation.allocate(self.requests, n, mode=self.merging.allocation)
        self.b_max = self._agree({w: [b] for w, b in local_b.items()})
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
        """This round's plan for every worker (computed alike everywhere; decisions need the others')."""
        mode = switch.mode_for(self.switch.schedule, self.switch.mode, len(self.trainers))
        self.mode = mode
        members = self.members()
        share: dict[int, int] = {}  # examples per step each worker is asked for
        for t, ws in members.items():
            b_t = self.trainers[t].request
            speeds = self._relative_speeds(ws)
            share.update(allocation.split(len(ws) * b_t, speeds) if speeds else dict.fromkeys(ws, b_t))
        plans = {w: switch.plan(share[w], self.b_max[w], mode, self.switch.kappa) for w in self.allocation}
        probes: dict[int, Probe] = {}
        b = self.batch
        if b.estimator == "pooled" and b.probing:
            need_p = b.test in ("inner_product", "augmented_inner_product")
            shared = batching.needs_shared_mean(b.test, b.estimator, b.exact_mean)
            keep = "chunks" if need_p else ("sum" if shared else "none")
            for ws in members.values():
                # one chunk size c for the trainer (from its smallest step); a worker with a larger share
                # contributes more chunks of c, up to probe_chunks (ALGORITHM.md §9.3): the pooled statistics stay exact
                k, c, extra = batching.probe_layout([plans[w].effective for w in ws], b.probe_chunks)
                for w in ws:
                    k_w = k if extra else max(1, min(plans[w].effective // c, b.probe_chunks))
                    probes[w] = Probe(k_w, c, extra, keep)
        self.plans = {
            w: WorkerPlan(
                w,
                t,
                members[t].index(w),
                len(members[t]),
                self.trainers[t].request,
                plans[w].micro,
                plans[w].accum,
                plans[w].capped,
                probes.get(w),
            )
            for w, t in self.allocation.items()
            if w in self.replicas
        }

    def _relative_speeds(self, workers: Sequence[int]) -> dict[int, float] | None:
        """Workers' speeds relative to the fastest, in steps of 1/8, or None for equal shares: with balance
        equal; when every worker runs on this process's one device and nothing is emulated (their speeds
        differ by noise alone); before every worker was measured; for DDP (its gradients are averaged
        with equal weights) and the paper estimator (its samples are whole steps of one size); and when
        the slowest is within 20% of the fastest."""
        if (
            self.balance == "equal"
            or self.ddp
            or len(workers) < 2
            or any(w not in self.speed for w in workers)
        ):
            return None
        if self.emulate is None and self.comm.one_device:
            return None
        if self.batch.estimator == "paper":  # its samples need one batch size per trainer (c = the step's)
            return None
        top = max(self.speed[w] for w in workers)
        rel = {w: self.speed[w] / top for w in workers}
        if min(rel.values()) > 0.8:
            return None
        return {w: max(1, round(8 * r)) / 8 for w, r in rel.items()}

    # -- inner steps -------------------------------------------------------------------------------
    def _begin_round(self) -> None:
        for w, rep in self.replicas.items():
            if self.inner_state == "reset":
                rep.reset_optimizer()
            if self.keep_snapshot:
                self._snap[w] = (
                    {k: v.to("cpu", copy=True) for k, v in rep.inner_state().items()},
                    rep.scalars(),
                )
        self._progress = {
            w: _Progress(_Clock(self.device), skipped_before=rep.skipped) for w, rep in self.replicas.items()
        }

    def _ensure_round(self) -> None:
        if not hasattr(self, "_progress"):
            self._begin_round()

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
        self._ensure_round()
        if stop and not self.ddp:
            self.sync(abort=True)
        losses: dict[int, torch.Tensor] = {}
        for w in self.local_workers:
            plan, rep, pr = self.plans[w], self.replicas[w], self._progress[w]
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
            self._ddp_reduce(stop)
        self._h += 1
        if self._h == self.H:
            self.sync()
        return losses

    def _ddp_reduce(self, stop: bool) -> None:
        """Synchronous data parallel: every trainer's workers average their gradients (one all-reduce of
        P values, counted as ``grad``) and take the same step. A stop request rides along as one more
        value (not counted), so every worker of a trainer stops at the same step."""
        buf = torch.zeros(self.n_params + 1, device=self.device)
        members = self.members()
        for t in self.alive:
            ws = members[t]
            buf.zero_()
            if self.wire == "float32":
                for w in self._local(ws):
                    buf[:-1].add_(self.replicas[w].flat.grad, alpha=1.0 / len(ws))
                buf[-1] = float(stop)
                self.comm.all_reduce(buf, ws, "grad", counted=self.n_params)
            else:  # compressed: the gradients through the compressed all-reduce, the flag on its own
                parts = {w: self.replicas[w].flat.grad / len(ws) for w in self._local(ws)}
                got = self.comm.all_reduce_compressed(
                    parts, ws, "grad", self.wire, self.wire_block, self.n_params
                )
                if got is not None:
                    buf[:-1].copy_(got)
                buf[-1] = float(stop)
                self.comm.all_reduce(buf[-1:], ws, "control", counted=0)
            if float(buf[-1]) > 0:
                stop = True
                continue
            for w in self._local(ws):
                pr, rep = self._progress[w], self.replicas[w]
                pr.clock.start()
                rep.flat.grad.copy_(buf[:-1])
                rep.optimizer_step()
                pr.clock.stop()
        if stop:
            self.sync(abort=True)

    # -- the hooked mode ---------------------------------------------------------------------------
    def __enter__(self) -> AdLoCo:
        """Hook every local replica's ``optimizer.step``: your loop runs forward, backward and step; every
        H steps the round synchronizes. There is no gradient probe in this mode."""
        if self.batch.test != "none" or self.batch.statistics:
            raise ValueError(
                "batch: the batch test needs the gradient probe at the round's first step, which only "
                "step()/step_all() can take; use them, or AdaptiveBatch(test='none', statistics=False)"
            )
        if self.ddp and len(self.replicas) > 1:
            raise ValueError("ddp: hooked optimizers need one worker per process (or per thread: ThreadComm)")
        for w, rep in self.replicas.items():
            # the round begins (inner_state reset, snapshot) before its first step, not after it
            pre = self._hooked_pre(w) if self.ddp else (lambda opt, args, kwargs: self._ensure_round())
            self._hooks.append(rep.optimizer.register_step_pre_hook(pre))
            self._hooks.append(rep.optimizer.register_step_post_hook(self._hooked_post(w)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _hooked_pre(self, w: int) -> Callable[..., None]:
        def hook(opt: Any, args: Any, kwargs: Any) -> None:
            self._ensure_round()
            rep = self.replicas[w]
            g = rep.flat.gather_grads()
            ws = self.members()[self.allocation[w]]
            g.div_(len(ws))
            if self.wire == "float32":
                self.comm.all_reduce(g, ws, "grad")
            else:
                got = self.comm.all_reduce_compressed(
                    {w: g}, ws, "grad", self.wire, self.wire_block, self.n_params
                )
                assert got is not None
                g.copy_(got)
            rep.flat.scatter_grads()

        return hook

    def _hooked_post(self, w: int) -> Callable[..., None]:
        def hook(opt: Any, args: Any, kwargs: Any) -> None:
            self._ensure_round()
            pr = self._progress[w]
            pr.steps += 1
            pr.examples += self.plans[w].effective
            if all(p.steps >= self.H for p in self._progress.values()):
                self._h = self.H
                self.sync()

        return hook

    # -- the synchronization -----------------------------------------------------------------------
    def sync(self, abort: bool = False) -> RoundReport:
        """End the round on every process (see the module docstring); returns its report.

        Called by the H-th step; call it yourself only to end a round early. ``abort``: undo it instead
        (every process raises :class:`RoundAborted`)."""
        self._ensure_round()
        r = self.round
        b = self.batch
        members = self.members()
        trainer_of = dict(self.allocation)
        plans = self.plans
        shared = b.probing and batching.needs_shared_mean(b.test, b.estimator, b.exact_mean)
        need_p = b.test in ("inner_product", "augmented_inner_product")

        # 1. gather every worker's scalars (and stop requests)
        local: dict[int, list[float]] = {}
        for w, rep in self.replicas.items():
            pr = self._progress[w]
            stats = pr.stats
            if b.estimator == "paper" and b.probing and pr.steps:  # the last gradient, unclipped: c = e
                sq, entries = rep.last_gradient()
                stats = batching.WorkerStats(1, plans[w].effective, sq, sq, sum_entries=entries)
            mean = (pr.loss / pr.steps).item() if pr.steps and pr.loss is not None else math.nan
            finite = pr.steps > 0 and (math.isfinite(mean) or pr.loss is None) and rep.finite()
            local[w] = WorkerRound(
                k=stats.n if stats else 0,
                c=stats.c if stats else 0,
                sum_sq=stats.sum_sq if stats else math.nan,
                mean_sq=stats.mean_sq if stats else math.nan,
                sum_entries=stats.sum_entries if stats else math.nan,
                has_stats=stats is not None,
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
        del self._progress
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
        fault_events = self._faults(r, members, results)
        ok = {t: [w for w in members[t] if results[w].finite] for t in self.alive}
        stats_of = {w: res.stats for w, res in results.items()}
        gbar_sq, dots = self._shared_mean(ok, stats_of, need_p) if shared else ({}, {})

        # 2. outer step of every trainer on Δ_t = Σ_m (n_m / n)(θ_t − θ_m): the pseudo-gradients, not
        #    the parameters, are all-reduced, so a compressed wire dtype keeps them
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
            buf = self.scratch.zero_()
            if self.wire == "float32":
                for w in self._local(ws):
                    torch.sub(self.theta(t), self.replicas[w].flat.param, out=self.scratch2)  # θ_t − θ_m
                    buf.add_(self.scratch2, alpha=results[w].examples / n_ex)
                self.comm.all_reduce(buf, ws, "delta")
            else:  # every worker's own (n_m/n)(θ_t − θ_m) is a participant of the compressed all-reduce
                parts = {
                    w: torch.sub(self.theta(t), self.replicas[w].flat.param).mul_(results[w].examples / n_ex)
                    for w in self._local(ws)
                }
                summed = self.comm.all_reduce_compressed(
                    parts, ws, "delta", self.wire, self.wire_block, self.n_params, self.feedback
                )
                if summed is not None:
                    buf.copy_(summed)
            if len(ws) < len(members[t]):
                # a worker left out still serves t: its process (possibly hosting no finite worker of t,
                # hence outside the all-reduce) needs Δ_t too, or its θ_t and momentum go stale
                self.comm.broadcast(buf, ws[0], members[t], "delta")
            if tr.theta is not None:
                with torch.no_grad():
                    tr.outer.step(tr.theta, buf)

        # 3. batch test -> new requests
        trainer_events = []
        for t in self.alive:
            ws = members[t]
            samples = [stats_of[w] for w in ok[t]]
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
            trainer_events.append(
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
                    examples=n_ex,
                )
            )
            tr.request = dec.request

        # 4. merge and reallocate
        merge_event, alloc_event = self._maybe_merge(r, members)

        # 5. workers load their trainer's θ; bookkeeping; the next round's plan
        for w, rep in self.replicas.items():
            rep.load(self.theta(self.allocation[w]))
        # training examples read: the steps' and the probe's extra rows (a budget counts both)
        examples = sum(res.examples + res.probe_examples for res in results.values())
        self.totals.examples += examples
        self.round += 1
        self._check_agreement()
        nbytes, msgs, comm_s, collectives = self._collect()
        self._plan()
        worker_events = [
            events.Worker(
                round=r + 1,
                worker=w,
                trainer=trainer_of[w],
                loss=events.num(res.loss),
                examples=res.examples,
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
            examples=examples,
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
        if hasattr(self, "_progress"):
            del self._progress
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

    def _shared_mean(
        self, members: dict[int, list[int]], stats: dict[int, batching.WorkerStats | None], need_p: bool
    ) -> tuple[dict[int, float], dict[int, dict[int, tuple[float, float]]]]:
        """All-reduce every trainer's mean probe gradient ḡ (P values) among its workers; returns ‖ḡ‖² per
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
            buf = self.scratch.zero_()
            if self.wire == "float32":
                for w in self._local(members[t]):
                    self.replicas[w].add_sample_sum(buf, paper)
                self.comm.all_reduce(buf, members[t], "probe")
            else:
                parts = {}
                for w in self._local(members[t]):
                    parts[w] = torch.zeros_like(buf)
                    self.replicas[w].add_sample_sum(parts[w], paper)
                summed = self.comm.all_reduce_compressed(
                    parts, members[t], "probe", self.wire, self.wire_block, self.n_params
                )
                if summed is not None:
                    buf.copy_(summed)
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

    def _maybe_merge(
        self, r: int, members: dict[int, list[int]]
    ) -> tuple[events.Merge | None, events.Allocation | None]:
        m = self.merging
        if m.policy == "none" or len(self.trainers) < 2 or (r + 1) % m.every != 0:
            return None, None
        S = merging.select(self.requests, m.policy, m.size)
        if len(S) < 2:
            return None, None
        w = merging.weights(self.requests, S)
        keep = merging.survivor(S)
        union = sorted(x for t in S for x in members[t])
        hosts_union = any(x in self.replicas for x in union)
        # θ_r = Σ_{j∈S} w_j θ_j, and the outer momentum alike: each process sums the trainers it leads,
        # so the SUM over the union's processes counts every trainer exactly once.
        parts: list[tuple[str, Callable[[TrainerState], torch.Tensor | None]]] = [
            ("theta", lambda tr: tr.theta)
        ]
        if self._new_outer().has_state:
            parts.append(("momentum", lambda tr: tr.momentum()))
        merged: dict[str, torch.Tensor] = {}
        for name, get in parts:
            led = {t: get(self.trainers[t]) for t in S if members[t][0] in self.replicas}
            buf = merging.weighted_merge(
                {t: v for t, v in led.items() if v is not None}, w, like=self.scratch
            )
            self.comm.all_reduce(buf, union, "merge")
            merged[name] = buf
        survivor = self.trainers[keep]
        if hosts_union:
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


S = TypeVar("S")


def _setting(name: str, value: Any, cls: type[S]) -> S:
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise ValueError(f"{name}: expected an {cls.__name__}(...) from adloco, got {value!r}")
    return value


def _default_comm(n_local: int) -> Comm:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from adloco.comm.torchdist import TorchDistComm

        return TorchDistComm(n_local)
    from adloco.comm.inprocess import InProcessComm

    return InProcessComm(n_local)
