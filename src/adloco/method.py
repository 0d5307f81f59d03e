"""AdLoCo, DiLoCo, LocalSGD and DDP as objects for your own training loop (ALGORITHM.md §6).

An algorithm object is built from this process's worker replicas (your ``nn.Module`` and inner
optimizer; several for workers simulated in one process), a communicator, and the dials of
:mod:`adloco.settings`. It owns the rounds: the loop asks it how many rows the next step needs, hands it
the batch, and it runs the step (micro-batches, the gradient probe at the round's first step, clipping,
the inner optimizer). After H steps it synchronizes by itself (``sync``), in the phases of a round
(ALGORITHM.md §6), one method each (:mod:`adloco.sync`). Its state dicts are :mod:`adloco.state`; the
hooked form (``with algo:``) is :mod:`adloco.hooked`.

Every vector collective goes through the communicator's one reducer (:meth:`adloco.comm.Comm.reduce`)
with the :class:`~adloco.settings.Wire` it travels as; every decision is a pure function of gathered
scalars, computed identically on every process, so no process is special. ``with algo:`` instead hooks
each replica's ``optimizer.step`` (:mod:`adloco.hooked`).
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

from adloco.algorithms import allocation, lr_scaling, switch
from adloco.algorithms.outer import OuterOptimizer
from adloco.comm.base import Comm, Part
from adloco.comm.quantize import ErrorFeedback
from adloco.hooked import HookedMode
from adloco.replica import Batch, LossFn, Replica, n_rows
from adloco.round import (
    Clock,
    DecisionMismatch,
    RoundAborted,
    RoundReport,
    Totals,
    TrainerState,
    WorkerPlan,
    WorkerProgress,
    plan_round,
    relative_speeds,
)
from adloco.settings import (
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
from adloco.streaming import Streaming, fragments
from adloco.sync import Flight, Synchronization

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


class AdLoCo(Synchronization, Streaming, HookedMode, AlgorithmState):
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
        fixed_rows: a forward and backward pass's fixed cost, in rows (α/β of a step-time profile,
            ALGORITHM.md §11; ``adloco train`` takes it from ``runtime.profile``). With balance speed, a
            worker's speed is measured net of it and each trainer's rows are shared so that every
            worker's step takes the same time, fixed cost included; 0: a step costs its rows alone.
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
        fixed_rows: float = 0.0,
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
        if not (isinstance(fixed_rows, int | float) and math.isfinite(fixed_rows) and fixed_rows >= 0):
            raise ValueError(f"fixed_rows = {fixed_rows!r}: must be a finite number >= 0 (rows)")
        self.fixed_rows = float(fixed_rows)
        self.clip, self.precision = clip, precision
        self.outer_spec = _dial("outer", outer, Outer)
        self.batch = _dial("batch", batch, AdaptiveBatch)
        self.merging = _dial("merge", merge, Merging)
        self.switch = _dial("switch", switch, Switch)
        self.wire = _dial("wire", wire, Wire)
        self.wire.check_streaming(inner_steps, self.ddp)
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
            w: Replica(m, o, loss_fn, clip=clip, precision=precision, b_max=b_max, shards=self.comm.shards)
            for w, m, o in zip(self.comm.local_workers, models, optimizers, strict=True)
        }
        sizes = {r.flat.numel for r in self.replicas.values()}
        if len(sizes) != 1:
            raise ValueError(
                f"model: replicas of different sizes ({sorted(sizes)} parameters); all must match"
            )
        self.n_params = sizes.pop()
        if self.wire.fragments > self.n_params:
            raise ValueError(
                f"comm.fragments = {self.wire.fragments}: more fragments than parameters ({self.n_params})"
            )
        self._fragments = fragments(self.n_params, self.wire.fragments)  # streaming (comm.fragments)
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
        # comm.overlap (ALGORITHM.md §13): Δs in flight, workers' eager starts and own Δs, seconds waited
        self._flights: list[Flight] = []
        self._starts: dict[int, torch.Tensor] = {}
        self._own: dict[int, torch.Tensor] = {}
        self._waited_s = 0.0
        self._theta_snap: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}  # streaming's undo
        self._streamed = 0  # the hooked form: inner steps whose fragments were handled

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
        """Every trainer alive's request b (rows per worker and inner step), by trainer id."""
        return {t: tr.request for t, tr in sorted(self.trainers.items())}

    @property
    def alive(self) -> list[int]:
        """The ids of the trainers alive, ascending (merges remove ids; the lowest survives)."""
        return sorted(self.trainers)

    @property
    def local_workers(self) -> list[int]:
        """The worker ids this process hosts, ascending."""
        return sorted(self.replicas)

    def members(self) -> dict[int, list[int]]:
        """Every trainer's workers (ids, ascending), by trainer id: the allocation seen from the trainers."""
        return allocation.members(self.allocation)

    def theta(self, t: int) -> torch.Tensor:
        """Trainer t's flat parameters θ_t (P float32 values) between rounds; only where a worker of t lives."""
        theta = self.trainers[t].theta
        if theta is None:
            raise ValueError(f"trainer {t}: not hosted by this process (no worker of it lives here)")
        return theta

    def model_of(self, t: int) -> nn.Module | None:
        """A local model holding trainer t's θ between rounds (its first local worker's), or None."""
        mine = self._local(self.members().get(t, []))
        return self.replicas[mine[0]].model if mine else None

    def start_of(self, w: int) -> torch.Tensor:
        """Where local worker w starts (or started) the current round: its trainer's θ, or its eager start
        (``comm.overlap: eager``, ALGORITHM.md §13)."""
        return self._starts.get(w, self.theta(self.allocation[w]))

    @contextlib.contextmanager
    def holding_theta(self, w: int) -> Iterator[nn.Module]:
        """Local worker w's model holding its trainer's θ for the block (evaluation between rounds); with
        an eager start, the start is put back after."""
        rep = self.replicas[w]
        eager = w in self._starts
        if eager:
            rep.load(self.theta(self.allocation[w]))
        try:
            yield rep.model
        finally:
            if eager:
                rep.load(self._starts[w])

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
        """Inner steps taken in the current round (0 between rounds)."""
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
        every = plan_round(
            self.requests, members, self.b_max, self.mode, self.switch, self.batch, speeds, self.fixed_rows
        )
        self.plans = {w: p for w, p in every.items() if w in self.replicas}
        self._rows = {w: p.effective for w, p in every.items()}  # every worker's rows per inner step
        self.step_rows = sum(p.effective for p in every.values())  # every worker's rows in one inner step
        # ALGORITHM.md §10: each trainer's lr multiplier follows the rows its steps use (b_t; b₀ its first)
        b = self.batch
        for t, ws in members.items():
            tr = self.trainers[t]
            b_t = sum(every[w].effective for w in ws) / len(ws)
            if tr.b0 is None:
                tr.b0 = b_t
            tr.lr_ratio = lr_scaling.ratio(b.lr_scaling, b_t, tr.b0, tr.noise)
        for w, rep in self.replicas.items():
            r = self.trainers[self.allocation[w]].lr_ratio
            rep.lr_scale = (
                lr_scaling.multiplier(r, rep.sgd, b.lr_scale_max) if b.lr_scaling != "none" else 1.0
            )

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
                        # inner_state() builds new tensors: on the host they are the snapshot already
                        {k: v.to("cpu") for k, v in rep.inner_state().items()},
                        rep.scalars(),
                    )
            if self.keep_snapshot and self.streaming:  # fragments step θ within the round
                self._theta_snap = {
                    t: (tr.theta.clone(), None if (m := tr.momentum()) is None else m.clone())
                    for t, tr in self.trainers.items()
                    if tr.theta is not None
                }
            self._streamed = 0
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
        if self._h < self.H:
            self._streaming(self._h)
        else:
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

    def _add_grad(self, w: int, out: torch.Tensor, scale: float) -> None:
        out.add_(self.replicas[w].flat.grad, alpha=scale)


def _default_comm(n_local: int) -> Comm:
    """torch.distributed's default group when it is initialized, else every worker in this process. A
    launcher that asks for several processes (``WORLD_SIZE`` > 1, as torchrun sets it) with no process
    group is refused: falling back to this process alone would train each process on its own, silently."""
    import os

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from adloco.comm.torchdist import TorchDistComm

        return TorchDistComm(n_local)
    world = os.environ.get("WORLD_SIZE", "1")
    if world.strip() != "1":
        raise ValueError(
            f"comm: WORLD_SIZE = {world!r} (a launcher such as torchrun started several processes) but "
            "torch.distributed's process group is not initialized: call "
            "torch.distributed.init_process_group() before building the algorithm, or pass comm= "
            "(adloco.InProcessComm(n) for workers in this process only)"
        )
    from adloco.comm.inprocess import InProcessComm

    return InProcessComm(n_local)
