"""AdLoCo, DiLoCo, LocalSGD and DDP as objects for your own training loop (ALGORITHM.md §6).

An algorithm object owns the rounds of this process's worker replicas: the loop asks it how many rows the
next step needs, hands it the batch, and it runs the step; after H steps it ends the round (``sync``),
phase by phase, one method each. It assembles parts that own their state: this process's workers
(:mod:`adloco.library.workers`), every trainer with its θ, outer optimizer, starts and Δ in flight
(:mod:`adloco.library.trainer`), when Δ travels (:mod:`adloco.library.streaming`), the batch tests
(:mod:`adloco.library.batch_tests`), merges and moves (:mod:`adloco.library.regroup`), the state dicts
(:mod:`adloco.library.state`) and the hooks of ``with algo:`` (:mod:`adloco.library.hooked`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from adloco import events
from adloco.library import hooked, state
from adloco.library.algorithms import allocation, lr_scaling
from adloco.library.algorithms.outer import OuterOptimizer, asks_shapes, model_shapes
from adloco.library.batch_tests import BatchTests
from adloco.library.comm import codecs, default_comm
from adloco.library.comm.base import Comm, reduce_local
from adloco.library.comm.quantize import ErrorFeedback
from adloco.library.fields import check_speeds, check_trainers
from adloco.library.options import RoundOptions, signature
from adloco.library.regroup import Regroup
from adloco.library.replica import Batch, LossFn, n_rows
from adloco.library.round import (
    DecisionMismatch,
    Gathered,
    Regrouped,
    RoundAborted,
    RoundReport,
    Totals,
    Traffic,
    WorkerPlan,
    WorkerProgress,
    check_agreement,
    relative_speeds,
)
from adloco.library.streaming import Schedule, fragments, in_flight, tensor_fragments
from adloco.library.trainer import Flight, Trainer, initial_thetas
from adloco.library.view import View
from adloco.library.workers import (
    Workers,
    as_list,
    build_replicas,
    faults,
    gather,
    plan_workers,
    update_b_max,
    update_speeds,
)

__all__ = ["AdLoCo", "DecisionMismatch", "RoundAborted"]

log = logging.getLogger("adloco")

Members = Mapping[int, list[int]]  # trainer -> its workers
Sizes = Mapping[int, int]  # worker -> examples or rows


class AdLoCo:
    """AdLoCo (arXiv 2508.18182): multi-instance training with trainer merging, adaptive batch sizes and
    switch mode, on DiLoCo rounds. DiLoCo, LocalSGD and DDP (:mod:`adloco.library.baselines`) are this class with
    parts turned off.

    Args:
        model: this process's worker replica(s): one ``nn.Module``, or a list for several workers in one
            process. Parameters must be float32; they move into a flat buffer (the objects stay).
        inner_optimizer: the optimizer of each replica (any ``torch.optim.Optimizer`` over all its
            parameters); its state persists across rounds.
        comm: the communicator; default: torch.distributed's default group when it is initialized
            (``TorchDistComm``), else all workers in this process (``InProcessComm``). Under a launcher
            of several processes (``WORLD_SIZE`` > 1) with no process group, a ``ValueError`` says to call
            ``torch.distributed.init_process_group()`` or pass ``comm``.
        loss_fn: ``loss_fn(model, batch)`` -> the mean loss over the batch's rows; default
            ``model(**batch).loss``.
        options: the round's dials as one :class:`~adloco.library.options.RoundOptions`; or give its fields as
            keywords, as the signature lists them (``inner_steps=10, trainers=2, outer=Outer("nesterov")``,
            each documented there), not both. A dial left unset is the method's (:attr:`METHOD`'s preset); a
            keyword that is no dial is Python's ``TypeError``.
    """

    METHOD: ClassVar[str] = (
        "adloco"  # the method's preset (adloco.library.presets.PRESETS) fills the dials left unset
    )
    ddp = False  # DDP: gradients averaged every step instead of rounds of local steps
    stated_batch: int | None = None  # rows per step the user stated (DiLoCo's batch_size); None: unknown

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        inner_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        *,
        comm: Comm | None = None,
        loss_fn: LossFn | None = None,
        options: RoundOptions | None = None,
        **dials: Any,
    ) -> None:
        o = self.options = RoundOptions.given(options, dials, type(self).__name__).for_method(self.METHOD)
        assert o.outer and o.batch and o.merge and o.switch and o.wire and o.sync  # for_method fills them
        models = as_list(model, "model")
        self.balance, self.on_resize, self.inner_state = o.balance, o.on_resize, o.inner_state
        self.fixed_rows = float(o.fixed_rows)
        self.clip, self.precision = o.clip, o.precision
        self.outer_spec, self.batch, self.merging, self.switch = o.outer, o.batch, o.merge, o.switch
        self.wire, self.sync_spec = o.wire, o.sync
        self.sync_spec.check_round(o.inner_steps, self.ddp, self.wire)
        self.wire.check_codec(self.batch, self.ddp)
        outer, own = self.outer_spec, codecs.rules(self.wire.dtype)
        if own is not None and own.outer and outer.optimizer == "nesterov" and outer.momentum > 0:
            log.warning(
                "comm.dtype = %r with outer.momentum = %g: its error feedback, decaying at β %g, already plays "
                "the momentum's part, and a momentum on top carries each sparse spike on (DiLoCo's preset "
                "diverged so); the codec's own outer step is %s (docs/guides/compression.md)",
                self.wire.dtype,
                outer.momentum,
                self.wire.decay,
                ", ".join(f"{k} {v}" for k, v in own.outer.items()),
            )
        if not self.ddp and (why := self.outer_spec.stale_momentum(self.sync_spec.overlap)) is not None:
            log.warning(why)
        self.comm = comm if comm is not None else default_comm(len(models))
        n = self.comm.n_workers
        b_max = self.switch.b_max_or_default
        if o.cuda_graphs and self.ddp:
            raise ValueError(
                "cuda_graphs: DDP averages gradients inside a step, which a captured step cannot"
            )
        self.cuda_graphs = o.cuda_graphs
        self.replicas = build_replicas(
            models, inner_optimizer, self.comm, loss_fn, o.clip, o.precision, b_max, o.cuda_graphs
        )
        lr_scaling.check_wd(
            self.batch.wd_scaling, [r.optimizer for r in self.replicas.values()], o.cuda_graphs
        )
        self._reduce = functools.partial(reduce_local, self.comm, wire=self.wire)  # on the round's wire
        check_trainers(o.trainers, n)
        assert o.trainers is not None
        self.H = o.inner_steps
        self.emulate = check_speeds(o.emulate_speed or [], n, "emulate_speed") or None
        self.speed: dict[int, float] = {}  # measured examples per second of every worker (a moving average)
        self.membership: dict[str, Any] | None = None  # the last load_state_dict's change of workers
        self.counts_rows = True  # False in the hooked form when the rows of a step are unknown
        self.n_params = next(iter(self.replicas.values())).flat.numel
        self.device = next(iter(self.replicas.values())).device
        # this process's workers; error feedback of each one's Δ (reset when it moves; in its state dict)
        feedback = self.wire.feedback
        self.workers = Workers(
            self.replicas, self.device, o.inner_state, o.snapshot, feedback, self.wire.decay
        )
        self.feedback: dict[int, ErrorFeedback] | None = self.workers.feedback
        self.scratch = torch.zeros(self.n_params, device=self.device)
        self.scratch2 = torch.zeros(self.n_params, device=self.device)
        flats = {w: rep.flat for w, rep in self.replicas.items()}
        # the parts: when Δ travels, the batch tests, merges and moves
        self.schedule = Schedule(self.sync_spec, o.inner_steps, self.ddp, flats, self.feedback, self.scratch2)
        self._parts, self._shapes = self._fragments()
        self.tests = BatchTests(self.batch, self.comm, self.replicas, self._reduce, self.scratch)
        self.regroup = Regroup(
            self.merging, self.comm, self.wire.theta, self.workers, self.scratch, self._new_outer
        )

        # Replicated state: identical on every process.
        self.round = 0  # rounds completed
        self.trainers = {t: self._new_trainer(t, self.batch.initial) for t in range(o.trainers)}
        self.allocation = allocation.allocate(self.requests, n, mode=self.merging.allocation)
        self.b_max = self.workers.agreed_b_max(self.comm)
        self.bad_rounds = 0
        self.totals = Totals()
        self.last_report: RoundReport | None = None

        # Heavy state: θ of the trainers this process hosts, taken from their first local worker.
        params = {w: rep.flat.param for w, rep in self.replicas.items()}
        sync = o.sync_initial and n > 1
        initial_thetas(self.trainers, self.members(), params, self.comm, self.scratch, sync)
        if sync:
            self._collect()
        for w, rep in self.replicas.items():
            rep.load(self.theta(self.allocation[w]))
        self.tests.warn(self.members())
        self._h = 0  # inner steps done in the current round
        self._hooks: list[Any] = []  # the hooked form's handles (inside `with algo:`)
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
    def view(self) -> View:
        """What an application reads of this object, read-only (:class:`adloco.library.view.View`)."""
        return View(self)

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
        """Where local worker w starts (or started) the current round: its trainer's θ, or its own start
        (eager's, or streaming's own parameters; ALGORITHM.md §13)."""
        tr = self.trainers[self.allocation[w]]
        return tr.starts.get(w, self.theta(tr.id))

    def holding_theta(self, w: int) -> contextlib.AbstractContextManager[nn.Module]:
        """Local worker w's model holding its trainer's θ for the block (evaluation between rounds); with
        a start of its own, the start is put back after."""
        return self.workers.holding(w, self.theta(self.allocation[w]), self.start_of(w))

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

    def _fragments(self) -> tuple[list[slice], list[tuple[str, torch.Size]] | None]:
        """The parts of θ that synchronize apart (``sync.fragments``; ALGORITHM.md §13) and the model's
        shapes for a factory's ``params.shaped()`` (None on sharded workers: a rank holds rows of each
        matrix). Fragments are even, but a factory that asks for the shapes (a matrix-aware step) gets
        fragments that end between whole tensors where the tensors allow it."""
        count, rep, make = self.schedule.count, next(iter(self.replicas.values())), self.outer_spec.factory
        if self.comm.shards.size > 1:
            return fragments(self.n_params, count), None
        shapes = model_shapes(rep.model, rep.flat.params)
        if count > 1 and not isinstance(make, str) and asks_shapes(make, rep.flat.param, shapes):
            whole = tensor_fragments([shape.numel() for _, shape in shapes], count)
            if whole is not None:
                return whole, shapes
        return fragments(self.n_params, count), shapes

    def _new_outer(self) -> OuterOptimizer:
        o = self.outer_spec
        why = (
            "runtime.shards > 1: a rank holds rows of each matrix, and a matrix-aware step on rows is not "
            "the step on the matrix"
        )
        return OuterOptimizer(o.factory, o.lr, o.momentum, parts=self._parts, shapes=self._shapes, why=why)

    def _new_trainer(self, t: int, request: int) -> Trainer:
        return Trainer(t, request, self._new_outer(), self._parts, self.comm, self.wire)

    def set_b_max(self, local: Mapping[int, int]) -> None:
        """Every process's workers' b_max (for example from a memory search), agreed by a gather; the
        current round's plan is remade. Call it on every process, between rounds."""
        if self._h:
            raise RuntimeError("set_b_max: only between rounds")
        for w, b in local.items():
            self.replicas[w].b_max = int(b)
        self.b_max = self.workers.agreed_b_max(self.comm)
        self._plan()

    def _plan(self) -> None:
        """This round's plan for every worker (:func:`adloco.library.workers.plan_workers`): switch mode, shares,
        probe layout and lr multipliers; the same everywhere (every worker's rows, ``_rows``, weight Δ)."""
        members = self.members()
        speeds = {t: self._relative_speeds(ws) for t, ws in members.items()}
        dials = (self.switch, self.batch, self.fixed_rows)
        self.mode, every = plan_workers(
            self.trainers, members, self.b_max, speeds, dials, self.allocation, self.replicas
        )
        self.plans = {w: p for w, p in every.items() if w in self.replicas}
        self._rows = {w: p.effective for w, p in every.items()}  # every worker's rows per inner step
        self.step_rows = sum(self._rows.values())  # every worker's rows in one inner step

    def _relative_speeds(self, workers: Sequence[int]) -> dict[int, float] | None:
        """Shares by measured speed (:func:`adloco.library.round.relative_speeds`), or None for equal shares: with
        balance equal; for DDP (gradients averaged with equal weights) and the paper estimator (samples are
        whole steps of one size); with every worker on one device and nothing emulated (speeds are noise)."""
        noise = self.emulate is None and self.comm.one_device
        equal = self.balance == "equal" or self.ddp or self.batch.estimator == "paper" or noise
        return None if equal else relative_speeds(self.speed, workers)

    # -- inner steps -------------------------------------------------------------------------------
    def _round_progress(self) -> dict[int, WorkerProgress]:
        """This round's bookkeeping, begun (inner state reset, snapshot) before its first step."""
        if self.workers.progress is None and self.workers.keep_snapshot and self.schedule.streaming:
            for tr in self.trainers.values():  # fragments step θ within the round: keep it to undo one
                tr.snapshot()
        return self.workers.begin()

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
        self._round_progress()  # the round begun: streaming keeps θ to undo it, the workers theirs
        if stop and not self.ddp:
            self.sync(abort=True)
        for w in self.local_workers:
            if n_rows(batches[w]) != self.plans[w].rows(h):
                raise ValueError(
                    f"batch of worker {w}: {n_rows(batches[w])} rows; step {h} of this round needs "
                    f"{self.plans[w].rows(h)} (batch_size() says how many)"
                )
        losses = self.workers.step(batches, self.plans, h, self.scratch, self.emulate, self.ddp)
        if self.ddp:
            self._ddp_step(stop)
        self._h += 1
        if self._h < self.H:
            self._synchronize(self._h)
        else:
            self.sync()
        return losses

    def _ddp_step(self, stop: bool) -> None:
        """Synchronous data parallel: every trainer's workers average their gradients and take the same
        step (:meth:`adloco.library.workers.Workers.ddp_step`); a stop request anywhere aborts the round."""
        if self._ddp_buf is None:
            self._ddp_buf = torch.empty(self.n_params + 1, device=self.device)
        if self.workers.ddp_step(self.members(), self._reduce, stop, self._ddp_buf):
            self.sync(abort=True)

    # -- the end of a round (ALGORITHM.md §6), phase by phase -----------------------------------------
    def sync(self, abort: bool = False) -> RoundReport:
        """End the round on every process, phase by phase; returns its report.

          1. :meth:`_gather`: every worker's scalars (statistics, losses, sizes, stop requests) on every
             process; non-finite workers left out;
          2. :meth:`_outer_steps`: every trainer's outer step on Δ = Σ_m (n_m/n)(θ_t − θ_m);
          3. :meth:`_batch_tests`: every trainer's batch test -> new requests;
          4. :meth:`_maybe_merge`: every f rounds while K > 1, merge by policy, share the workers again,
             send θ to moved workers;
          5. :meth:`_next_round`: workers load their start; the round counted, its decisions checked for
             agreement across processes, the next round planned, the report made.

        Called by the H-th step; call it yourself only to end a round early. ``abort``: undo it instead
        (every process raises :class:`RoundAborted`)."""
        gathered = self._gather(abort)  # 1.
        self._outer_steps(gathered)  # 2.
        trainer_events = self._batch_tests(gathered)  # 3.
        regrouped = self._maybe_merge(gathered.members)  # 4.
        return self._next_round(gathered, trainer_events, regrouped)  # 5.

    def _gather(self, abort: bool) -> Gathered:
        """Phase 1 (:func:`adloco.library.workers.gather`): every worker's scalars on every process (a stop request
        anywhere aborts the round everywhere), out-of-memory b_max changes, measured speeds, and non-finite
        workers (left out of the outer step and the batch test, their inner state reset, counted)."""
        r, members = self.round, self.members()
        results = gather(self.workers, self.comm, self.plans, self.batch, abort)
        if any(res.aborted for res in results.values()):
            self._undo()
            raise RoundAborted(r + 1)
        self._h = 0
        self.workers.end()
        update_b_max(self.b_max, results, r)
        update_speeds(self.speed, results, self.fixed_rows)
        fault_events, bad = faults(r, members, results, self.allocation)
        self.bad_rounds = self.bad_rounds + 1 if bad else 0
        self.workers.left_out(bad, r, self.bad_rounds)
        return Gathered(members, dict(self.allocation), results, fault_events)

    def _outer_steps(self, gathered: Gathered) -> None:
        """Phase 2: every trainer's outer step on Δ_t = Σ_m (n_m / n)(θ_t − θ_m) over its finite workers, as
        the schedule has it (:meth:`_synchronize`; behind compute: this round's Δ launched, an earlier one
        landed; streaming: fragment 0). Pseudo-gradients, not parameters, are reduced, so a compressed wire
        keeps them. DDP: the workers stepped together on averaged gradients, so θ is any of theirs."""
        if not self.ddp:
            return self._synchronize(self.H, gathered.ok, gathered.examples)
        for t, ws in gathered.ok.items():
            mine, tr = self._local(ws), self.trainers[t]
            if mine and tr.theta is not None:
                tr.theta.copy_(self.replicas[mine[0]].flat.param)

    def _batch_tests(self, gathered: Gathered) -> list[events.Trainer]:
        """Phase 3: every trainer's batch test on its finite workers' statistics -> new requests
        (:class:`adloco.library.batch_tests.BatchTests`); it reads no θ, so it does not wait for what is in flight."""
        seen = (self.totals.examples or 0) + sum(
            x.examples + x.probe_examples for x in gathered.results.values()
        )
        return self.tests.run(self.trainers, gathered, self.round, self.counts_rows, seen)

    def _maybe_merge(self, members: dict[int, list[int]]) -> Regrouped:
        """Phase 4: every f rounds while K > 1, merge the trainers the policy selects into the lowest id and
        share the workers again (ALGORITHM.md §3–4, :class:`adloco.library.regroup.Regroup`), after landing
        everything in flight (a merge is a round boundary)."""
        merged = self.regroup.due(self.requests, self.round)
        if not merged:
            return None, None
        self.schedule.settle(self.trainers)
        speeds = self._relative_speeds(sorted(self.allocation))
        merge_event, alloc_event, self.allocation = self.regroup.run(
            self.trainers, self.allocation, merged, members, self.round, speeds
        )
        return merge_event, alloc_event

    def _next_round(
        self, gathered: Gathered, trainer_events: list[events.Trainer], regrouped: Regrouped
    ) -> RoundReport:
        """Phase 5: workers load where they start the next round (:meth:`adloco.library.trainer.Trainer.start_next`);
        the round counted, its decisions checked for agreement, the next round planned, the report made."""
        whole, alpha, results = regrouped[0] is not None, self.sync_spec.fragment_alpha, gathered.results
        for w, rep in self.replicas.items():
            tr, fresh = self.trainers[self.allocation[w]], whole or not results[w].finite
            rep.load(tr.start_next(w, rep.flat.param, fresh, self.schedule.streaming, alpha))
        examples = self.totals.count(results.values(), self.counts_rows)
        self.round += 1
        check_agreement(self.comm, self.round, self.requests, self.allocation, self.local_workers)
        traffic = self._collect()
        self._plan()
        self.last_report = RoundReport.of(
            self.round, gathered, trainer_events, regrouped, self.mode, examples, traffic, self.counts_rows
        )
        return self.last_report

    def _undo(self) -> None:
        """An aborted round: its reductions dropped; workers back where they started it (with ``snapshot``,
        their inner state too, and, streaming, the trainers' θ and outer state, which fragments stepped)."""
        self._h = 0
        for tr in self.trainers.values():
            tr.undo(self.round + 1)
        self.workers.undo({w: self.start_of(w) for w in self.replicas})
        self.comm.drain()

    def _collect(self) -> Traffic:
        """What was communicated since the last call (simulated time prices it), added to the totals."""
        waited, self.schedule.waited_s = self.schedule.waited_s, 0.0
        return Traffic.count(self.comm.drain(), waited, self.totals)

    def _synchronize(self, h: int, senders: Members | None = None, examples: Sizes | None = None) -> None:
        """What the schedule has due after inner step h (:meth:`adloco.library.streaming.Schedule.run`, the one
        place Δ is launched and landed); h = H is phase 2, with the round's finite workers ``senders``
        weighted by their ``examples``. Within the round every member sends, weighted by its rows."""
        if not self.schedule.due(h):
            return
        members = self.members()
        if senders is None or examples is None or self.schedule.streaming:
            senders, examples = members, self._rows
        self.schedule.run(h, self.round + 1, self.trainers, members, senders, examples)

    @property
    def _flights(self) -> list[Flight]:
        """Every reduction in flight (every trainer's, every fragment's), in launch order."""
        return in_flight(self.trainers)

    def settle(self) -> Traffic:
        """Land every Δ in flight (``sync.overlap``) and load every worker with its trainer's θ (streaming:
        its own fragments too): the end of training, or wherever the model must be whole. Call it on every
        process, between rounds; returns what it communicated, counted as a round's."""
        if self._h:
            raise RuntimeError("settle: only between rounds")
        if not self.schedule.settle(self.trainers, whole=True):
            return Traffic()
        for w, rep in self.replicas.items():
            rep.load(self.theta(self.allocation[w]))
        return self._collect()

    # -- state (ALGORITHM.md §9.2, ALGORITHM.md §13): each part's, put together by adloco.library.state ---------
    def state_dict(self) -> dict[str, Any]:
        """This process's state: the replicated decisions, θ and outer state of the trainers it hosts, the
        state of its workers. Between rounds only. With ``sync.overlap`` it first waits for what is in
        flight: each trainer's average (``pending``) is applied when it would have landed (ALGORITHM.md §13)."""
        return state.local(self._decisions(), self.trainers, self.workers, self.schedule, self.comm)

    def full_state_dict(self) -> dict[str, Any] | None:
        """Every trainer's and worker's state, gathered on the root rank (None elsewhere): what a checkpoint
        holds, whatever the workers' processes (:func:`adloco.library.state.full`). Every process must call it; the
        transfers are output, not training, and are not counted."""
        d = self._decisions()
        return state.full(d, self.trainers, self.workers, self.schedule, self.comm, self.scratch)

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` or :meth:`full_state_dict` (this process takes its part); a worker
        without inner state starts a fresh inner optimizer. A full state written with another number of
        workers is first resized (ALGORITHM.md §9.2); what changed is in :attr:`membership`."""
        resize = (self.merging, self.on_resize, self.batch.max)
        d, self.trainers, self.membership = state.load(
            saved, self.comm, self.workers, self.schedule, self._new_trainer, resize, self.scratch
        )
        self.round, self.allocation, self.b_max, self.bad_rounds, self.totals, self.speed = d.fields()
        self._h = 0
        self._plan()

    def _decisions(self) -> state.Decisions:
        d = (self.round, self.allocation, self.b_max, self.bad_rounds, self.totals, self.speed)
        return state.Decisions(*d)

    def gather_parameters(self, t: int) -> torch.Tensor | None:
        """Trainer t's θ on the root rank (sharded: each root worker's rank its shard), None elsewhere;
        every process must call it (not counted). The algorithm's scratch vector: read it before the
        next round."""
        return state.gather_parameters(self.trainers[t], self.members()[t][0], self.comm, self.scratch)

    # -- the hooked form (``with algo:``, adloco.library.hooked) -------------------------------------------------
    def __enter__(self) -> Any:
        """Hook every local replica's ``optimizer.step``: your loop runs forward, backward and step; every
        H steps the round synchronizes. Examples are counted only when the rows of a step were stated
        (``batch_size`` of DiLoCo, LocalSGD and DDP); otherwise ``totals.examples`` is None (unknown)."""
        hooked.check(self.batch, self.ddp, len(self.replicas), self.cuda_graphs)
        self.counts_rows = self.stated_batch is not None
        average = self._average_grads if self.ddp else None
        hooks = hooked.Hooks(
            self.H,
            self._round_progress,
            self._rows_of,
            self._synchronize,
            self._end_round,
            average,
            self.workers.before_write,
        )
        self._hooks = hooks.install(self.replicas)
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.counts_rows = True

    def _rows_of(self, w: int) -> int:
        return self.stated_batch or self.plans[w].effective  # unknown rows: Δ weighted by steps

    def _end_round(self) -> RoundReport:
        self._h = self.H
        return self.sync()

    def _average_grads(self, w: int) -> None:
        hooked.average_grads(self.replicas[w], self.members()[self.allocation[w]], self._reduce, self.scratch)


def spell_out(cls: type[AdLoCo]) -> None:
    """``help(cls)`` and the API reference list every dial of ``cls`` (AdLoCo or a class of it) with the
    default its method gives it (:func:`adloco.library.options.signature`), not ``**dials``."""
    sig = signature(cls.__init__, cls.METHOD)
    cls.__signature__ = sig  # type: ignore[attr-defined]
    if "__init__" in vars(cls):
        self_ = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        cls.__init__.__signature__ = sig.replace(parameters=[self_, *sig.parameters.values()])  # type: ignore[attr-defined]


spell_out(AdLoCo)
