"""The end of a round (ALGORITHM.md §6), phase by phase, one method each; a mixin of
:class:`adloco.method.AdLoCo`, which runs the inner steps.

  1. :meth:`~Synchronization._gather`: every worker's scalars (statistics, losses, sizes, stop requests)
     on every process; non-finite workers left out;
  2. :meth:`~Synchronization._outer_steps`: every trainer's outer step on Δ = Σ_m (n_m/n)(θ_t − θ_m);
  3. :meth:`~Synchronization._batch_tests`: every trainer's batch test (with the mean probe gradient where
     the test needs it, :meth:`~Synchronization._shared_mean`) -> new requests;
  4. :meth:`~Synchronization._maybe_merge`: every f rounds while K > 1, merge by policy, share the workers
     again, send θ to moved workers (:meth:`~Synchronization._move`);
  5. :meth:`~Synchronization._next_round`: workers load their trainer's θ; the round counted, its
     decisions checked for agreement across processes, the next round planned, the report made.

With ``comm.overlap`` (ALGORITHM.md §13) phase 2 launches Δ on the communicator's background lane
(:meth:`~Synchronization._launch`) and applies the previous round's when it lands
(:meth:`~Synchronization._land`); a merge, a checkpoint and the end of training wait for everything in
flight (:meth:`~Synchronization.settle`).

Every vector travels through the communicator's one reducer (:meth:`adloco.comm.Comm.reduce`); every
decision is a pure function of gathered scalars (:mod:`adloco.algorithms`), the same on every process.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from adloco import events
from adloco.algorithms import allocation, batching, lr_scaling, merging
from adloco.comm.base import Part, Pending
from adloco.round import (
    WIDTH,
    DecisionMismatch,
    RoundAborted,
    RoundReport,
    Traffic,
    TrainerState,
    WorkerRound,
    measured_speed,
)

if TYPE_CHECKING:
    from adloco.algorithms.outer import OuterOptimizer
    from adloco.comm.base import Comm
    from adloco.comm.quantize import ErrorFeedback
    from adloco.replica import Replica
    from adloco.round import Totals, WorkerPlan, WorkerProgress
    from adloco.settings import AdaptiveBatch, Merging, Wire

log = logging.getLogger("adloco")


@dataclass
class Flight:
    """A trainer's Δ in flight (``comm.overlap``): its reduction and the buffer it lands in, the finite
    workers that sent it and the trainer's members then, and the round that made it (1-based)."""

    trainer: int
    pending: Pending
    buf: torch.Tensor
    sent: list[int]
    members: list[int]
    round: int
    received: bool = False
    fragment: int = -1  # streaming (comm.fragments): which fragment of the parameters; -1: all of them


class Synchronization:
    """:meth:`sync` and its phases."""

    if TYPE_CHECKING:  # what the algorithm object provides
        comm: Comm
        replicas: dict[int, Replica]
        trainers: dict[int, TrainerState]
        allocation: dict[int, int]
        plans: dict[int, WorkerPlan]
        feedback: dict[int, ErrorFeedback] | None
        b_max: dict[int, int]
        speed: dict[int, float]
        fixed_rows: float
        totals: Totals
        batch: AdaptiveBatch
        merging: Merging
        wire: Wire
        scratch: torch.Tensor
        scratch2: torch.Tensor
        n_params: int
        round: int
        bad_rounds: int
        mode: str
        ddp: bool
        counts_rows: bool
        keep_snapshot: bool
        last_report: RoundReport | None
        _h: int
        _snap: dict[int, tuple[dict[str, torch.Tensor], list[float]]]
        _progress: dict[int, WorkerProgress] | None
        _flights: list[Flight]
        _starts: dict[int, torch.Tensor]
        _own: dict[int, torch.Tensor]
        _waited_s: float
        _fragments: list[slice]
        _theta_snap: dict[int, tuple[torch.Tensor, torch.Tensor | None]]

        @property
        def streaming(self) -> bool: ...
        def _fragment_end(self) -> None: ...

        @property
        def requests(self) -> dict[int, int]: ...
        @property
        def alive(self) -> list[int]: ...
        def members(self) -> dict[int, list[int]]: ...
        def theta(self, t: int) -> torch.Tensor: ...
        def _local(self, workers: Sequence[int]) -> list[int]: ...
        def _new_outer(self) -> OuterOptimizer: ...
        def _plan(self) -> None: ...
        def _round_progress(self) -> dict[int, WorkerProgress]: ...
        def _relative_speeds(self, workers: Sequence[int]) -> dict[int, float] | None: ...
        def _reduce(
            self,
            workers: Sequence[int],
            kind: str,
            out: torch.Tensor,
            add: Callable[[int, torch.Tensor], None],
            wire: Wire | None = None,
            feedback: Mapping[int, ErrorFeedback] | None = None,
            control: int = 0,
        ) -> bool: ...

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
        if self.comm.shards.size > 1:
            local = {w: self._whole_worker(row) for w, row in local.items()}
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
        for w, res in results.items():  # rows per second, a moving average (replicated: gathered numbers)
            v = measured_speed(res, self.fixed_rows)
            if v > 0:
                self.speed[w] = v if w not in self.speed else 0.5 * v + 0.5 * self.speed[w]
        return results, self._faults(r, members, results)

    def _whole_worker(self, row: list[float]) -> list[float]:
        """A sharded worker's row from its ranks' (ALGORITHM.md §12): the loss is the mean of their
        weighted parts, the compute time the slowest rank's, a stop request or a non-finite shard anyone's,
        b_max the smallest; the statistics were summed over the shards already (the replica's)."""
        res = WorkerRound.from_row(row)
        shards = self.comm.shards
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

    def _outer_steps(
        self, members: dict[int, list[int]], ok: dict[int, list[int]], results: dict[int, WorkerRound]
    ) -> None:
        """Phase 2: every trainer's outer step on Δ_t = Σ_m (n_m / n)(θ_t − θ_m), over its finite workers.
        The pseudo-gradients, not the parameters, are reduced, so a compressed wire keeps them. Behind
        compute (``comm.overlap``): this round's Δ launched, the previous round's applied."""
        if self.streaming:
            self._fragment_end()
            return
        if self.wire.overlap != "none" and not self.ddp:
            for t in self.alive:
                if ok[t]:
                    self._launch(t, ok[t], members[t], results)
            for f in [f for f in self._flights if f.round <= self.round]:
                self._land(f, behind=1.0)
            return
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

    # -- behind compute (comm.overlap, ALGORITHM.md §13) ---------------------------------------------
    def _launch(self, t: int, ws: list[int], members: list[int], results: dict[int, WorkerRound]) -> None:
        """Trainer t's Δ = Σ_m (n_m / n)(s_m − θ_m) on the background lane, s_m where worker m started the
        round (θ_t, or its eager start). With ``eager``, each local worker's own s_m − θ_m is kept for its
        next start (:meth:`_start_next`)."""
        n_ex = sum(results[w].examples for w in ws)
        eager = self.wire.overlap == "eager"
        theta = self.theta(t) if self.trainers[t].hosted else None

        def add(w: int, out: torch.Tensor) -> None:
            start = self._starts.get(w, theta)
            assert start is not None
            own = torch.sub(start, self.replicas[w].flat.param, out=self.scratch2)
            if eager:
                own = self._own[w] = own.clone()
            out.add_(own, alpha=results[w].examples / n_ex)

        parts: dict[int, Part] = {w: functools.partial(add, w) for w in self._local(ws)}
        buf = torch.empty_like(self.scratch)
        pending = self.comm.reduce_async(parts, ws, "delta", buf, self.wire, self.feedback)
        self._flights.append(Flight(t, pending, buf, list(ws), list(members), self.round + 1))

    def _receive(self, f: Flight) -> None:
        """Wait for ``f``; a worker of the trainer left out of it (non-finite) gets the average too."""
        if f.received:
            return
        f.pending.wait()
        self._waited_s += f.pending.waited_s
        if len(f.sent) < len(f.members):  # as in phase 2: its process may be outside the reduction
            self.comm.broadcast(f.buf, f.sent[0], f.members, "delta")
        f.received = True

    def _land(self, f: Flight, behind: float = 0.0, step: bool = True) -> None:
        """Apply ``f``: the trainer's outer step on its average (its fragment's part of θ and the momentum,
        streaming); its collectives counted now, as run behind that share of a round's compute (1: a
        whole round, launched by the round before; 0: on the critical path)."""
        self._receive(f)
        self.comm.records.extend(
            r if r.behind == behind else dataclasses.replace(r, behind=behind) for r in f.pending.records
        )
        tr = self.trainers[f.trainer]
        if tr.theta is not None and step:
            with torch.no_grad():
                tr.outer.step(tr.theta, f.buf, self._part(f.fragment))
        self._flights.remove(f)

    def _part(self, fragment: int) -> slice:
        """The flat parameters' slice of a fragment (streaming); -1: all of them."""
        return slice(None) if fragment < 0 else self._fragments[fragment]

    def _settle(self) -> None:
        """Land everything in flight; the next round starts from every trainer's θ (no eager start)."""
        for f in list(self._flights):
            self._land(f)
        self._own.clear()

    def settle(self) -> Traffic:
        """Wait for every Δ in flight (``comm.overlap``), apply it, and load every worker with its trainer's
        θ (streaming: its own fragments too): the end of training, or a point where the model must be
        whole. Call it on every process, between rounds. Returns what it communicated, counted as a
        round's (nothing in flight: nothing)."""
        if self._h:
            raise RuntimeError("settle: only between rounds")
        if not self._flights and not self._starts:
            return Traffic()
        self._settle()
        self._starts.clear()
        for w, rep in self.replicas.items():
            rep.load(self.theta(self.allocation[w]))
        return self._collect()

    def _start_next(self, w: int, fresh: bool) -> torch.Tensor:
        """Where worker w starts the next round: its trainer's θ; or (``eager``) the outer step of its own
        Δ taken from there, to be corrected when the average lands; or (streaming) its own parameters with
        fragment 0 mixed with θ, the other fragments as their last synchronization left them. ``fresh``
        (after a merge, a move, or a non-finite round): θ."""
        theta = self.theta(self.allocation[w])
        own = self._own.pop(w, None)
        if fresh or (own is None and not self.streaming):
            self._starts.pop(w, None)
            return theta
        start = self._starts.get(w)
        if start is None:
            start = self._starts[w] = torch.empty_like(theta)
        if own is not None:
            return self.trainers[self.allocation[w]].outer.trial(theta, own, start)
        part, alpha = self._fragments[0], self.wire.fragment_alpha
        start.copy_(self.replicas[w].flat.param)
        start[part].mul_(alpha).add_(theta[part], alpha=1.0 - alpha)
        return start

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
                    examples=n_ex if self.counts_rows else None,
                    lr=events.num(lead.lr),
                    lr_scale=lead.lr_scale,
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
            g2 = float(self.comm.shards.sum_(torch.dot(gbar, gbar).reshape(1).double())[0])  # every shard
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
        self._settle()  # a merge is a round boundary: θ and the momentum must be whole
        w = merging.weights(self.requests, S)
        keep = merging.survivor(S)
        union = sorted(x for t in S for x in members[t])
        # θ_r = Σ_{j∈S} w_j θ_j, and the outer momentum alike: a trainer's part is added by its first
        # worker's process, so the sum over the union's processes counts every trainer exactly once.
        led = {members[t][0]: t for t in S if members[t][0] in self.replicas}
        merged: dict[str, torch.Tensor] = {}
        wire = self.wire.theta
        for name in ("theta", "momentum") if self._new_outer().has_state else ("theta",):

            def add(x: int, out: torch.Tensor, name: str = name) -> None:
                tr = self.trainers[led[x]]
                value = tr.theta if name == "theta" else tr.momentum()
                if value is not None:
                    out.add_(value, alpha=w[led[x]])

            buf = torch.empty_like(self.scratch)
            parts: dict[int, Part] = {x: functools.partial(add, x) for x in sorted(led, key=lambda x: led[x])}
            if wire.compressed:  # every worker of the union is a participant: the others add nothing
                parts.update({x: _nothing for x in self._local(union) if x not in parts})
            self.comm.reduce(parts, union, "merge", buf, wire)
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
        for t in sorted({new[x] for x in moved}):  # through comm.theta_dtype (ALGORITHM.md §9.4)
            tr = self.trainers[t]
            newcomers = [x for x in moved if new[x] == t]
            if self._local(newcomers) and not tr.hosted:  # this process receives a trainer it did not host
                tr.theta = torch.zeros_like(self.scratch)
            values = [tr.theta, tr.momentum()] if tr.outer.has_state else [tr.theta]
            for value in values:
                self.comm.send(
                    value if value is not None else self.scratch,
                    holders[t],
                    newcomers,
                    "move",
                    self.wire.theta,
                )
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
        whole = merge_event is not None
        for w, rep in self.replicas.items():
            rep.load(self._start_next(w, whole or not results[w].finite))
        # training examples read: the steps' and the probe's extra rows (a budget counts both)
        examples = sum(res.examples + res.probe_examples for res in results.values())
        if self.counts_rows and self.totals.examples is not None:
            self.totals.examples += examples
        else:  # the hooked mode without a batch size: the rows of a step were never seen
            self.totals.examples = None
        self.round += 1
        self._check_agreement()
        traffic = self._collect()
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
            bytes=traffic.bytes,
            messages=traffic.messages,
            comm_s=traffic.comm_s,
            collectives=traffic.collectives,
            behind=traffic.behind,
            behind_s=traffic.behind_s,
            wait_s=traffic.wait_s,
            compute_s={w: res.compute_s for w, res in results.items()},
            idle_share=sum(e.idle_share for e in trainer_events) / max(len(trainer_events), 1),
        )
        return self.last_report

    def _undo(self) -> None:
        """An aborted round: workers back to θ (and, with ``snapshot``, their inner state) at its start;
        streaming, with ``snapshot``, the trainers' θ and momentum too (fragments stepped them)."""
        self._h = 0
        self._progress = None
        for f in [f for f in self._flights if f.round > self.round]:  # this round's fragments
            f.pending.wait()
            self._flights.remove(f)
        for t, (theta, momentum) in self._theta_snap.items():
            tr = self.trainers[t]
            if tr.theta is not None:
                tr.theta.copy_(theta)
                if momentum is not None:
                    tr.outer.load_state_dict({"momentum": momentum})
        for w, rep in self.replicas.items():
            if self.keep_snapshot and w in self._snap:
                state, scalars = self._snap[w]
                rep.load_inner_state(state)
                rep.load_scalars(scalars)
            rep.load(self._starts.get(w, self.theta(self.allocation[w])))
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

    def _collect(self) -> Traffic:
        """What was communicated since the last call (:class:`adloco.round.Traffic`), added to the totals.
        Its rows are what the network model prices (simulated time)."""
        recs = self.comm.drain()
        nbytes = sum(r.wire for r in recs)
        msgs = sum(1 for r in recs if r.workers > 1)
        self.totals.bytes += nbytes
        self.totals.messages += msgs
        counts: dict[tuple[str, str, int, int, float], int] = {}
        for rec in recs:
            self.totals.by_kind[rec.kind] = self.totals.by_kind.get(rec.kind, 0) + rec.wire
            if rec.workers > 1:
                key = (rec.kind, rec.op, rec.workers, rec.payload, rec.behind)
                counts[key] = counts.get(key, 0) + 1
        waited, self._waited_s = self._waited_s, 0.0
        return Traffic(
            nbytes,
            msgs,
            sum(r.seconds for r in recs if not r.behind) + waited,
            [[*k[:4], c] for k, c in counts.items() if not k[4]],
            [[*k[:4], c, k[4]] for k, c in counts.items() if k[4]],
            sum(r.seconds for r in recs if r.behind),
            waited,
        )

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


def _nothing(out: torch.Tensor) -> None:
    """The part of a worker that takes part in a compressed all-reduce without a value of its own."""
