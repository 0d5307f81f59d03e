"""The round (spec §6), identical for every backend.

Each process runs one coordinator. The replicated state (round, trainers alive with their requests and
data subsets, allocation) is small, and every decision that changes it is a pure function of gathered
scalars, computed identically on every process. The heavy state (worker replicas with their inner
optimizers, trainer θ and outer momentum) lives only where it is needed. In the in-process backend one
coordinator hosts everything.

One round:
  1. every local worker runs H inner steps (gradient probe at the first, at the common point θ_t);
  2. scalars are gathered; where the batch test needs it, the trainer's mean probe gradient is
     all-reduced;
  3. every trainer's outer step (one all-reduce of Σ w_m θ_m among its workers, Δ = θ_t − that);
  4. every trainer's batch test -> new requests;
  5. every f rounds while K > 1: merge by policy, reallocate workers, send θ to moved workers;
  6. workers load their trainer's θ; evaluate; log.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from adloco import netmodel
from adloco.algorithms import allocation, batching, merging, switch
from adloco.algorithms.outer import OuterOptimizer
from adloco.config import Config
from adloco.data.sampling import ShardStream, trainer_subset
from adloco.data.tokens import Data
from adloco.engine import faults
from adloco.engine.comm import Comm
from adloco.engine.flat import FlatModule
from adloco.engine.inner import lr_at, reset_state
from adloco.engine.trainer import Trainer
from adloco.engine.worker import ProbeSpec, RoundResult, Worker
from adloco.evaluation import evaluate, perplexity, spread
from adloco.models import ModelFactory
from adloco.telemetry.metrics import MetricsSink
from adloco.telemetry.progress import Progress


@dataclass
class Totals:
    examples: int = 0
    bytes: int = 0
    messages: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    sim_s: float = 0.0


class Coordinator:
    def __init__(
        self,
        cfg: Config,
        comm: Comm,
        data: Data,
        factory: ModelFactory,
        device: torch.device,
        log: Callable[[str], None] = print,
    ) -> None:
        self.cfg, self.comm, self.data, self.device, self.log = cfg, comm, data, device, log
        a = cfg.algorithm
        self.round = 0  # rounds completed
        self.trainers: dict[int, Trainer] = {
            t: Trainer(
                t,
                cfg.batch.initial,
                trainer_subset(data.n_train, cfg.data.subset_fraction, a.seed, t),
                self._new_outer(),
            )
            for t in range(a.trainers)
        }
        self.allocation = allocation.allocate(self.requests, a.workers, mode=cfg.merge.allocation)
        # b_max is never larger than a worker's shard (spec §5).
        smallest_shard = max(1, min(len(tr.subset) for tr in self.trainers.values()) // a.workers)
        configured = cfg.switch.b_max if cfg.switch.b_max is not None else 8
        self.b_max = {w: min(configured, smallest_shard) for w in range(a.workers)}
        if cfg.switch.b_max is not None and cfg.switch.b_max > smallest_shard:
            log(
                f"switch.b_max lowered to {smallest_shard}: with every worker on one trainer, a worker's shard "
                "holds no more blocks"
            )
        if cfg.batch.estimator == "paper" and min(len(ws) for ws in self.members().values()) < 2:
            log(
                "batch.estimator = paper needs two or more workers per trainer: a trainer with one worker "
                "keeps its request until a merge gives it more (the pooled estimator has no such limit)"
            )

        # Models: one prototype (a preset drawn from the seed, or the checkpoint); trainer θ from it
        # (init same) or from a seed per trainer (independent), with its output layer redrawn if asked.
        proto = factory.build(a.seed)
        for t in sorted({self.allocation[w] for w in comm.local_workers}):
            seed_t = a.seed if cfg.model.init == "same" else a.seed + 7919 * (t + 1)
            model = copy.deepcopy(proto) if cfg.model.init == "same" else factory.build(seed_t)
            if cfg.model.reinit_output:
                factory.reinit_output(model, seed_t)
            self.trainers[t].theta = FlatModule(model.to(device)).param
        self.workers: dict[int, Worker] = {
            w: Worker(w, copy.deepcopy(proto).to(device), cfg.inner, self.b_max[w], cfg.model.precision)
            for w in comm.local_workers
        }
        self.n_params = next(iter(self.workers.values())).flat.numel
        # two P-sized buffers for reductions, allocated once
        self.scratch = torch.zeros(self.n_params, device=device)
        self.scratch2 = torch.zeros(self.n_params, device=device)
        self.wire_dtype = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            cfg.comm.dtype
        ]
        if device.type == "cuda" and cfg.switch.b_max is None:
            self._search_b_max(min(smallest_shard, cfg.batch.max))
        self._load_workers()
        self.totals = Totals()
        self.last_eval: dict[int, float] = {}
        self.last_accuracy: dict[int, float] = {}
        self.initial_metrics: dict[str, Any] = {}
        self.bad_rounds = 0  # consecutive rounds with a non-finite worker
        self.elapsed = 0.0  # seconds of training before this process started (a resumed run)
        self.stop_requested: Callable[[], bool] = lambda: False  # set by whoever handles signals
        self._rng: list[torch.Tensor] = []

    def _search_b_max(self, hi: int) -> None:
        """b_max on CUDA (spec §5): the same search on every process, agreed through a gather."""
        from adloco.engine import memory
        from adloco.engine.worker import rows as take_rows

        worker = next(iter(self.workers.values()))
        free, _ = torch.cuda.mem_get_info(self.device)
        budget = self.cfg.switch.memory_fraction * free / len(self.workers)
        i = self.cfg.inner
        buffers = 2 if i.optimizer == "adamw" else (1 if i.momentum > 0 else 0)
        full = self.data.train_batch(np.arange(hi) % self.data.n_train)

        def step(b: int) -> None:
            worker.flat.zero_grad()
            try:
                worker._forward_backward(worker._to_device(take_rows(full, 0, b)), 1.0)
            finally:
                worker.flat.zero_grad()

        b = memory.cuda_b_max(step, budget, buffers * 4 * self.n_params, hi, self.device)
        got = self.comm.all_gather_rows({w: [b] for w in self.workers}, 1, "check", counted=0)
        self.b_max = {w: int(v[0]) for w, v in got.items()}
        for w, wk in self.workers.items():
            wk.b_max = self.b_max[w]
        self.log(
            f"b_max {min(self.b_max.values())}: the largest micro-batch under {self.cfg.switch.memory_fraction:g} "
            f"of free CUDA memory ({free / 2**30:.1f} GiB) shared by {len(self.workers)} worker(s) (at most {hi})"
        )

    # -- state -------------------------------------------------------------------------------------
    @property
    def alive(self) -> list[int]:
        return sorted(self.trainers)

    @property
    def requests(self) -> dict[int, int]:
        return {t: tr.request for t, tr in sorted(self.trainers.items())}

    def members(self) -> dict[int, list[int]]:
        return allocation.members(self.allocation)

    def theta(self, t: int) -> torch.Tensor:
        theta = self.trainers[t].theta
        assert theta is not None, f"trainer {t} is not hosted by this process"
        return theta

    def _new_outer(self) -> OuterOptimizer:
        o = self.cfg.outer
        return OuterOptimizer(o.optimizer, o.lr, o.momentum)

    def _local(self, workers: list[int]) -> list[int]:
        return [w for w in workers if w in self.workers]

    def _load_workers(self) -> None:
        for w, worker in self.workers.items():
            worker.load(self.theta(self.allocation[w]))

    def _collect(self) -> tuple[int, int, float, list[list[Any]]]:
        """(bytes, messages, seconds in counted collectives, [kind, op, n, payload, count] rows) since the
        last call; added to the totals. The rows are what the network model prices (simulated time)."""
        recs = self.comm.drain()
        nbytes = sum(r.wire for r in recs)
        msgs = sum(1 for r in recs if r.workers > 1)
        self.totals.bytes += nbytes
        self.totals.messages += msgs
        counts: dict[tuple[str, str, int, int], int] = {}
        for r in recs:
            self.totals.by_kind[r.kind] = self.totals.by_kind.get(r.kind, 0) + r.wire
            if r.workers > 1:
                key = (r.kind, r.op, r.workers, r.payload)
                counts[key] = counts.get(key, 0) + 1
        rows = [[*k, c] for k, c in counts.items()]
        return nbytes, msgs, sum(r.seconds for r in recs), rows

    # -- evaluation --------------------------------------------------------------------------------
    def evaluate(self) -> dict[int, float]:
        """Validation loss of every trainer alive (and accuracy, for classification), evaluated by its
        leader (lowest worker id); returns the losses and keeps the accuracies in ``last_accuracy``."""
        members = self.members()
        indices = spread(self.data.n_val, self.cfg.eval.max_examples)
        rows: dict[int, list[float]] = {w: [math.nan, math.nan] for w in self.workers}
        for t in self.alive:
            leader = members[t][0]
            if leader in self.workers:
                res = evaluate(
                    self.workers[leader].model,
                    self.data.val_batch,
                    indices,
                    self.cfg.eval.batch_size,
                    self.data.task,
                )
                rows[leader] = [res.loss, math.nan if res.accuracy is None else res.accuracy]
        gathered = self.comm.all_gather_rows(rows, 2, "eval", counted=0)  # measurement, not training
        self.last_eval = {t: gathered[members[t][0]][0] for t in self.alive}
        self.last_accuracy = {t: gathered[members[t][0]][1] for t in self.alive}
        return self.last_eval

    # -- one round ---------------------------------------------------------------------------------
    def run_round(self, on_step: Callable[[], None] = lambda: None) -> dict[str, Any]:
        cfg, comm = self.cfg, self.comm
        a, bcfg = cfg.algorithm, cfg.batch
        r = self.round
        faults.inject(comm.rank, r + 1)
        t_start = time.perf_counter()
        trainer_of = dict(self.allocation)  # this round's allocation (a merge may change it)
        members = self.members()
        mode = switch.mode_for(cfg.switch.schedule, cfg.switch.mode, len(self.trainers))
        plans = {
            w: switch.plan(self.trainers[t].request, self.b_max[w], mode, cfg.switch.kappa)
            for w, t in self.allocation.items()
        }
        probing = bcfg.test != "none" or bcfg.statistics
        shared = probing and batching.needs_shared_mean(bcfg.test, bcfg.estimator, bcfg.exact_mean)
        need_p = bcfg.test in ("inner_product", "augmented_inner_product")
        probes: dict[int, ProbeSpec] = {}
        if bcfg.estimator == "pooled" and probing:
            keep = "chunks" if need_p else ("sum" if shared else "none")
            for t in self.alive:
                k, c, extra = batching.probe_layout(
                    [plans[w].effective for w in members[t]], bcfg.probe_chunks
                )
                probes[t] = ProbeSpec(k, c, extra, keep)

        # 1. inner steps (the state at their start is remembered, so a stopped round can be undone)
        if cfg.inner.state == "reset":
            for worker in self.workers.values():
                reset_state(worker.optimizer)
        for worker in self.workers.values():
            worker.snapshot()
        self._rng = _rng_state()
        total_steps = a.rounds * a.inner_steps
        local: dict[int, RoundResult] = {}
        done = [0]

        def stepped() -> None:
            done[0] += 1
            faults.after_step(comm.rank, r + 1, done[0])
            on_step()

        ddp = a.method == "ddp"
        for w in [] if ddp else sorted(self.workers):
            t = trainer_of[w]
            stream = ShardStream(self.trainers[t].subset, a.seed, t, r, members[t].index(w), len(members[t]))
            local[w] = self.workers[w].run_round(
                stream,
                self.data.train_batch,
                plans[w],
                a.inner_steps,
                lambda h: lr_at(r * a.inner_steps + h, total_steps, cfg.inner),
                probes.get(t),
                self.scratch,
                stepped,
                self.stop_requested,
                faults.poisoned(w, r + 1),
            )
        if ddp:
            local = self._ddp_steps(r, members, plans, stepped)
        if bcfg.estimator == "paper" and probing:  # each worker's last gradient, unclipped: one sample, c = e
            for w, res in local.items():
                sq = self.workers[w].last_gradient_sq()
                res.stats = batching.WorkerStats(1, plans[w].effective, sq, sq)

        # 2. gather scalars; the shared mean probe gradient where the test needs it
        # (the algorithm needs the statistics; losses and timings ride along for logging, uncounted)
        counted = RoundResult.STATS_FIELDS if probing else 0
        rows = comm.all_gather_rows(
            {w: res.to_row() for w, res in local.items()}, RoundResult.FIELDS, "stats", counted
        )
        results = {w: RoundResult.from_row(rows[w]) for w in sorted(rows)}
        if any(res.stopped for res in results.values()):  # a signal: undo the round everywhere
            self.rollback()
            raise RoundStopped(r + 1)
        for w, res in results.items():
            if res.b_max != self.b_max[w]:
                self.log(f"round {r + 1}: worker {w} ran out of memory; b_max {self.b_max[w]} -> {res.b_max}")
                self.b_max[w] = res.b_max
        # Numerical faults: a worker whose loss or parameters are not finite is left out of its trainer's
        # outer step and batch test; a trainer with no finite worker skips the round.
        fault_events = self._faults(r, members, results)
        ok = {t: [w for w in members[t] if results[w].finite] for t in self.alive}
        gbar_sq = self._shared_mean(ok, results, need_p) if shared else {}

        # 3. outer step of every trainer on Δ_t = Σ_m (n_m / n)(θ_t − θ_m). The pseudo-gradients, not the
        #    parameters, are what is all-reduced: they are small, so a compressed wire dtype keeps them.
        for t in self.alive:
            ws = ok[t]
            if not ws:
                continue
            if ddp:  # the workers stepped together on averaged gradients: θ is any of theirs
                mine = self._local(ws)
                if mine and self.trainers[t].hosted:
                    self.theta(t).copy_(self.workers[mine[0]].flat.param)
                continue
            n_ex = sum(results[w].examples for w in ws)
            buf = self.scratch.zero_()
            for w in self._local(ws):
                torch.sub(self.theta(t), self.workers[w].flat.param, out=self.scratch2)  # θ_t − θ_m
                buf.add_(self.scratch2, alpha=results[w].examples / n_ex)
            comm.all_reduce(buf, ws, "delta", dtype=self.wire_dtype)
            if self.trainers[t].hosted:
                self.trainers[t].outer_step(buf)

        # 4. batch test -> new requests
        trainer_events = []
        for t in self.alive:
            ws = members[t]
            stats = [results[w].stats for w in ok[t]]
            pooled = None
            if stats and all(s is not None for s in stats) and len({s.c for s in stats if s}) == 1:
                pooled = batching.pool([s for s in stats if s], gbar_sq.get(t) if shared else None)
            tr = self.trainers[t]
            dec = batching.decide(
                tr.request, bcfg.test, pooled, cap=bcfg.max, eta=bcfg.eta, vartheta=bcfg.vartheta, nu=bcfg.nu
            )
            if dec.reason == "degenerate":
                self.log(
                    f"round {r + 1}: trainer {t}: vanishing or non-finite gradient statistics; "
                    f"request kept at {tr.request}"
                )
            n_ex = sum(results[w].examples for w in ws)
            trainer_events.append(
                {
                    "event": "trainer",
                    "round": r + 1,
                    "trainer": t,
                    "workers": ws,
                    "request": tr.request,
                    "request_next": dec.request,
                    "target": _num(dec.target),
                    "reason": dec.reason,
                    "loss": _num(sum(results[w].loss * results[w].examples for w in ws) / n_ex),
                    "sigma2": _num(pooled.sigma2) if pooled else None,
                    "gbar_sq": _num(pooled.gbar_sq) if pooled else None,
                    "samples": pooled.n if pooled else None,
                    "effective": plans[ws[0]].effective,
                    "micro": plans[ws[0]].micro,
                    "accum": plans[ws[0]].accum,
                }
            )
            tr.request = dec.request

        # 5. merge and reallocate
        merge_events = self._maybe_merge(r, members)

        # 6. workers load their trainer's θ; evaluate; log
        self._load_workers()
        examples = sum(res.examples for res in results.values())
        self.totals.examples += examples
        self.round += 1
        self._check_agreement()
        train_s = time.perf_counter() - t_start
        nbytes, msgs, comm_s, collectives = self._collect()
        net = cfg.network
        sim_s = netmodel.round_seconds(
            {w: res.compute_s for w, res in results.items()},
            collectives,
            net.bandwidth,
            net.latency,
            cfg.runtime.worker_speeds,
        )
        self.totals.sim_s += sim_s
        val = self.evaluate() if self.round % cfg.eval.every == 0 or self.round == a.rounds else None
        events: list[dict[str, Any]] = [
            {
                "event": "worker",
                "round": r + 1,
                "worker": w,
                "trainer": trainer_of[w],
                "loss": _num(res.loss),
                "examples": res.examples,
                "probe_examples": res.probe_examples,
                "micro": res.micro,
                "accum": res.accum,
                "effective": res.micro * res.accum,
                "capped": res.capped,
                "finite": res.finite,
                "compute_s": res.compute_s,
            }
            for w, res in results.items()
        ]
        events += fault_events + trainer_events + merge_events
        summary: dict[str, Any] = {
            "event": "round",
            "round": self.round,
            "trainers_alive": len(self.trainers),
            "requests": {str(t): b for t, b in self.requests.items()},
            "allocation": {str(w): t for w, t in self.allocation.items()},
            "switch_mode": mode,
            "loss": _num(sum(res.loss * res.examples for res in results.values()) / max(examples, 1)),
            "examples": examples,
            "examples_total": self.totals.examples,
            "bytes": nbytes,
            "bytes_total": self.totals.bytes,
            "communications": msgs,
            "communications_total": self.totals.messages,
            "round_s": time.perf_counter() - t_start,  # with evaluation
            "train_s": train_s,  # without evaluation
            "comm_s": comm_s,  # of train_s, in counted collectives (this process's view, waits included)
            "max_compute_s": max(res.compute_s for res in results.values()),
            "collectives": collectives,  # [kind, op, workers, payload bytes, count]: counted ones only
            "sim_s": sim_s,  # simulated: slowest worker's compute + the network model (spec §7)
            "sim_total_s": self.totals.sim_s,
        }
        if val is not None:
            summary.update(self._val_metrics(self._best(val)))
            summary["val_by_trainer"] = {str(t): self._val_metrics(t) for t in val}
            events += [
                {"event": "eval", "round": self.round, "trainer": t, **self._val_metrics(t)} for t in val
            ]
        events.append(summary)
        return {"summary": summary, "events": events}

    def _ddp_steps(
        self, r: int, members: dict[int, list[int]], plans: dict[int, Any], on_step: Callable[[], None]
    ) -> dict[int, RoundResult]:
        """Synchronous data parallel in the same engine: every step, each trainer's workers average their
        gradients (one all-reduce of P values) and take the same optimizer step, so they stay identical."""
        a, cfg = self.cfg.algorithm, self.cfg
        total = a.rounds * a.inner_steps
        streams = {}
        for w in self.workers:
            t = self.allocation[w]
            streams[w] = ShardStream(
                self.trainers[t].subset, a.seed, t, r, members[t].index(w), len(members[t])
            )
        loss = {w: torch.zeros((), device=self.device) for w in self.workers}
        compute = dict.fromkeys(self.workers, 0.0)
        done, stopped = 0, False
        for h in range(a.inner_steps):
            if self.stop_requested():
                stopped = True
                break
            for t in self.alive:
                ws = members[t]
                buf = self.scratch.zero_()
                for w in self._local(ws):
                    wk, t0 = self.workers[w], time.perf_counter()
                    batch = wk._to_device(self.data.train_batch(streams[w].take(plans[w].effective)))
                    loss[w] += wk._accumulate(batch, min(plans[w].micro, wk.b_max))
                    buf.add_(wk.flat.grad, alpha=1.0 / len(ws))
                    compute[w] += time.perf_counter() - t0
                self.comm.all_reduce(buf, ws, "grad", dtype=self.wire_dtype)
                for w in self._local(ws):
                    wk, t0 = self.workers[w], time.perf_counter()
                    for group in wk.optimizer.param_groups:
                        group["lr"] = lr_at(r * a.inner_steps + h, total, cfg.inner)
                    wk.flat.grad.copy_(buf)
                    wk._step()
                    compute[w] += time.perf_counter() - t0
                    on_step()
            done += 1
        out = {}
        for w, wk in self.workers.items():
            mean = (loss[w] / done).item() if done else math.nan
            finite = done > 0 and math.isfinite(mean) and bool(torch.isfinite(wk.flat.param).all())
            p = plans[w]
            out[w] = RoundResult(
                mean,
                done,
                done * p.effective,
                0,
                finite,
                compute[w],
                min(p.micro, wk.b_max),
                p.accum,
                p.capped,
                None,
                0,
                stopped,
                wk.b_max,
            )
        return out

    def _faults(
        self, r: int, members: dict[int, list[int]], results: dict[int, RoundResult]
    ) -> list[dict[str, Any]]:
        """Log the round's non-finite workers, reset their inner state, count consecutive bad rounds."""
        events: list[dict[str, Any]] = []
        bad = [w for w in sorted(results) if not results[w].finite]
        self.bad_rounds = self.bad_rounds + 1 if bad else 0
        for w in bad:
            t = self.allocation[w]
            events.append(
                {
                    "event": "fault",
                    "round": r + 1,
                    "worker": w,
                    "trainer": t,
                    "kind": "non_finite",
                    "action": "left out of the outer step; inner optimizer state reset",
                }
            )
            if w in self.workers:
                self.workers[w].reset_optimizer()
        for t in self.alive:
            if members[t] and all(w in bad for w in members[t]):
                events.append(
                    {
                        "event": "fault",
                        "round": r + 1,
                        "trainer": t,
                        "kind": "trainer_skipped",
                        "action": "no finite worker: θ and request kept",
                    }
                )
        if bad:
            self.log(
                f"round {r + 1}: worker(s) {', '.join(map(str, bad))} produced a non-finite loss or update; "
                f"left out of the outer step ({self.bad_rounds} bad round(s) in a row, the run stops at "
                f"{self.cfg.faults.max_bad_rounds})"
            )
        return events

    def rollback(self) -> None:
        """Undo a round that was stopped part-way: workers back to θ and their state at its start."""
        for worker in self.workers.values():
            worker.rollback()
        self._load_workers()
        _set_rng_state(self._rng)

    def _shared_mean(
        self,
        members: dict[int, list[int]],
        results: dict[int, RoundResult],
        need_p: bool,
    ) -> dict[int, float]:
        """All-reduce every trainer's mean probe gradient ḡ (P values) among its workers; returns ‖ḡ‖² per
        trainer and, for the inner-product tests, fills each worker's Σ_j <g_j, ḡ> and Σ_j <g_j, ḡ>².

        Only processes hosting a worker of trainer t see its ḡ, so ‖ḡ‖² travels in the scalar gather that
        follows: every process must decide every trainer's request from the same numbers.
        """
        paper = self.cfg.batch.estimator == "paper"
        rows: dict[int, list[float]] = {w: [math.nan, math.nan, math.nan] for w in self.workers}
        pooled: list[int] = []
        for t in self.alive:
            stats = [results[w].stats for w in members[t]]
            if any(s is None for s in stats) or len({s.c for s in stats if s}) != 1:
                continue
            pooled.append(t)
            n_t = sum(s.n for s in stats if s)
            buf = self.scratch.zero_()
            for w in self._local(members[t]):
                self.workers[w].add_sample_sum(buf, paper)
            self.comm.all_reduce(buf, members[t], "probe", dtype=self.wire_dtype)
            gbar = buf.div_(n_t)  # ḡ: (P,)
            g2 = float(torch.dot(gbar, gbar))
            for w in self._local(members[t]):
                rows[w][0] = g2
                if need_p:
                    p = self.workers[w].sample_dots(gbar, paper)  # (k,)
                    rows[w][1:] = [float(p.sum()), float((p * p).sum())]
        gathered = self.comm.all_gather_rows(rows, 3, "stats", counted=3 if need_p else 1)
        if need_p:
            for w, res in results.items():
                s = res.stats
                if s is not None and math.isfinite(gathered[w][1]):
                    res.stats = batching.WorkerStats(
                        s.n, s.c, s.sum_sq, s.mean_sq, gathered[w][1], gathered[w][2]
                    )
        return {t: gathered[members[t][0]][0] for t in pooled}

    def _maybe_merge(self, r: int, members: dict[int, list[int]]) -> list[dict[str, Any]]:
        m = self.cfg.merge
        if m.policy == "none" or len(self.trainers) < 2 or (r + 1) % m.every != 0:
            return []
        S = merging.select(self.requests, m.policy, m.size)
        if len(S) < 2:
            return []
        w = merging.weights(self.requests, S)
        keep = merging.survivor(S)
        union = sorted(x for t in S for x in members[t])
        hosts_union = any(x in self.workers for x in union)
        # θ_r = Σ_{j∈S} w_j θ_j, and the outer momentum alike; each trainer's leader contributes once,
        # so the SUM over the union's processes counts every trainer exactly once.
        parts = [("theta", lambda tr: tr.theta)]
        if self._new_outer().has_state:
            parts.append(("momentum", lambda tr: tr.momentum()))
        merged: dict[str, torch.Tensor] = {}
        for name, get in parts:
            buf = self.scratch.zero_()
            for t in S:
                if members[t][0] in self.workers:
                    buf.add_(get(self.trainers[t]), alpha=w[t])
            self.comm.all_reduce(buf, union, "merge")
            merged[name] = buf.clone()
        survivor = self.trainers[keep]
        if hosts_union:
            survivor.theta = merged["theta"]
            survivor.outer = self._new_outer()
            if "momentum" in merged:
                survivor.outer.v = merged["momentum"]
        survivor.request = merging.merged_request(self.requests, S, m.survivor_batch, keep)
        for t in S:
            if t != keep:
                del self.trainers[t]

        # Reallocate: the workers of merged trainers already hold the survivor's θ.
        current = {x: (keep if t in S else t) for x, t in self.allocation.items()}
        new = allocation.allocate(self.requests, self.cfg.algorithm.workers, current, m.allocation)
        holders = allocation.members(current)
        moved = [x for x in sorted(new) if new[x] != current[x]]
        for x in moved:
            tr = self.trainers[new[x]]
            src = holders[tr.id][0]
            if x in self.workers and not tr.hosted:  # this process receives a trainer it did not host
                tr.theta = torch.zeros_like(self.scratch)
            theta = (
                tr.theta if tr.theta is not None else self.scratch
            )  # a process not involved passes a dummy
            self.comm.broadcast(theta, src, [src, x], "move")
            if tr.outer.has_state:
                momentum = tr.momentum()
                self.comm.broadcast(momentum if momentum is not None else self.scratch, src, [src, x], "move")
        changed = [x for x in sorted(new) if new[x] != self.allocation[x]]
        for x in changed:
            if x in self.workers:
                self.workers[x].reset_optimizer()
        self.allocation = new
        hosted = {new[x] for x in self.workers}
        for t, tr in self.trainers.items():
            if t not in hosted:  # keep heavy state only where a worker of the trainer lives
                tr.theta = None
                tr.outer = self._new_outer()
        return [
            {
                "event": "merge",
                "round": r + 1,
                "merged": S,
                "survivor": keep,
                "weights": {str(t): v for t, v in w.items()},
                "request": survivor.request,
                "trainers_alive": len(self.trainers),
            },
            {
                "event": "allocation",
                "round": r + 1,
                "allocation": {str(x): t for x, t in new.items()},
                "moved": moved,
                "reset": changed,
            },
        ]

    def _best(self, losses: dict[int, float]) -> int:
        """The trainer with the lowest validation loss (ties: lowest id; nan counts as worst)."""
        return min(
            losses,
            key=lambda t: (not math.isfinite(losses[t]), losses[t] if math.isfinite(losses[t]) else 0, t),
        )

    def _val_metrics(self, t: int) -> dict[str, float | None]:
        """val_loss and val_ppl (language modelling) or val_accuracy (classification) of trainer t."""
        loss = self.last_eval[t]
        if self.data.task == "classification":
            return {"val_loss": _num(loss), "val_ppl": None, "val_accuracy": _num(self.last_accuracy[t])}
        return {"val_loss": _num(loss), "val_ppl": _num(perplexity(loss))}

    # -- whole run ---------------------------------------------------------------------------------
    def run(
        self,
        sink: MetricsSink,
        progress: Progress,
        after_round: Callable[[bool], None] = lambda final: None,
    ) -> dict[str, Any]:
        """Train until ``algorithm.rounds``; ``after_round(final)`` runs after every round is logged (the
        checkpoint hook). A resumed coordinator (``restore``) continues from its round."""
        a = self.cfg.algorithm
        t0 = time.perf_counter() - self.elapsed
        budget = a.budget or math.inf
        if not self.initial_metrics:
            self.initial_metrics = self._val_metrics(self._best(self.evaluate()))
            self._collect()
            sink.log(
                {
                    "event": "start",
                    "round": 0,
                    "parameters": self.n_params,
                    "workers": a.workers,
                    "trainers": a.trainers,
                    "allocation": {str(w): t for w, t in self.allocation.items()},
                    **self.initial_metrics,
                    "task": self.data.task,
                    "train_examples": self.data.n_train,
                    "val_examples": self.data.n_val,
                    "processes": self.comm.world,
                    "threads_per_process": torch.get_num_threads(),
                }
            )
        initial_metrics = self.initial_metrics
        progress.start(a.rounds, a.inner_steps * len(self.workers), initial_metrics)
        while self.round < a.rounds and self.totals.examples < budget:
            progress.round_started(self.round + 1)
            out = self.run_round(progress.step)
            for e in out["events"]:
                sink.log(e)
            progress.round_done(out["summary"])
            self.elapsed = time.perf_counter() - t0
            failing = self.bad_rounds >= self.cfg.faults.max_bad_rounds
            after_round(self.round == a.rounds or self.totals.examples >= budget or failing)
            if failing:
                raise TooManyBadRounds(
                    f"round {self.round}: {self.bad_rounds} rounds in a row with a non-finite worker loss or "
                    "update (faults.max_bad_rounds); lower inner.lr or inner.clip"
                )
        progress.close()
        best = self._best(self.last_eval or self.evaluate())
        final = self._val_metrics(best)
        out = {
            "method": a.method,
            "rounds": self.round,
            "initial_val_ppl": initial_metrics["val_ppl"],
            "final_val_ppl": final["val_ppl"],
            "final_val_loss": final["val_loss"],
            "trainers_final": len(self.trainers),
            "requests_final": {str(t): b for t, b in self.requests.items()},
            "examples_total": self.totals.examples,
            "communications_total": self.totals.messages,
            "bytes_total": self.totals.bytes,
            "bytes_by_kind": dict(sorted(self.totals.by_kind.items())),
            "wall_s": time.perf_counter() - t0,
            "sim_s": self.totals.sim_s,
            "peak_memory_bytes": _peak_memory(self.device),
            "best_trainer": best,
        }
        if self.data.task == "classification":
            out["initial_val_accuracy"] = initial_metrics["val_accuracy"]
            out["final_val_accuracy"] = final["val_accuracy"]
        return out

    def _check_agreement(self) -> None:
        """Every process must have made the same decisions; compare a hash of them (not counted)."""
        state = [self.round, self.requests, sorted(self.allocation.items())]
        digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
        h = float(int(digest[:13], 16))  # 52 bits: exact in a float64
        got = self.comm.all_gather_rows({w: [h] for w in self.workers}, 1, "check", counted=0)
        ranks: dict[float, set[int]] = {}
        for w, (v,) in got.items():
            ranks.setdefault(v, set()).add(self.comm.owner(w))
        if len(ranks) > 1:
            groups = " vs ".join("ranks " + ",".join(map(str, sorted(r))) for r in ranks.values())
            raise DecisionMismatch(
                f"round {self.round}: processes disagree on requests, merges or allocation ({groups}); "
                "this is a bug or non-deterministic arithmetic, please report it with the run directory"
            )

    def fingerprint(self) -> str:
        """The model's parameter names and shapes, hashed: a checkpoint must match them."""
        model = next(iter(self.workers.values())).model
        text = ";".join(f"{n}:{tuple(p.shape)}" for n, p in model.named_parameters())
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def trainer_state_dict(self, t: int) -> dict[str, torch.Tensor] | None:
        """Trainer t's parameters as a model state dict, on rank 0 (None elsewhere).

        Every process must call it: when rank 0 does not host trainer t, its leader's process sends θ.
        """
        leader = self.members()[t][0]
        tr = self.trainers[t]
        buf = self.scratch
        if tr.theta is not None:
            buf.copy_(tr.theta)
        self.comm.fetch(buf, leader)
        if self.comm.rank != 0:
            return None
        worker = next(iter(self.workers.values()))
        worker.load(buf)
        state = worker.flat.clone_state_dict()
        worker.load(self.theta(self.allocation[worker.id]))
        return state


# -- checkpoints ------------------------------------------------------------------------------------
# Saved per logical trainer and worker, not per process: a checkpoint does not depend on how workers
# were spread over processes.
Emit = Callable[[str, dict[str, torch.Tensor]], None]


def save_state(co: Coordinator, emit: Emit | None) -> dict[str, Any]:
    """Everything needed to continue after the last completed round. Every process calls it; rank 0
    receives the tensors of the others (not counted: output, not training), hands each file to ``emit``
    and returns the metadata (other ranks: an empty dict)."""
    root = co.comm.rank == 0
    members = co.members()
    buf = co.scratch
    for t in co.alive:
        tr = co.trainers[t]
        tensors: dict[str, torch.Tensor] = {}
        parts: list[tuple[str, torch.Tensor | None]] = [("theta", tr.theta)]
        if tr.outer.has_state:
            parts.append(("momentum", tr.momentum()))
        for key, value in parts:
            if value is not None:
                buf.copy_(value)
            co.comm.fetch(buf, members[t][0])
            if root:
                tensors[key] = buf.clone()
        if root and emit is not None:
            emit(f"trainer-{t}.safetensors", tensors)
    keys = _inner_keys(co.cfg)
    states = {w: wk.inner_state() for w, wk in co.workers.items()}
    groups = len(next(iter(co.workers.values())).flat.groups)
    rows = {
        w: [
            float(bool(st)),
            *([*st["step"].tolist(), 0.0, 0.0][:2] if "step" in st else [0.0, 0.0]),
            *co.workers[w].scalars(),
        ]
        for w, st in states.items()
    }
    got = co.comm.all_gather_rows(rows, 7, "check", counted=0)
    workers_meta: dict[str, Any] = {}
    for w in range(co.cfg.algorithm.workers):
        has = bool(got[w][0])
        tensors = {}
        for k in keys if has else []:
            if w in states:
                buf.copy_(states[w][k])
            co.comm.fetch(buf, w)
            if root:
                tensors[k] = buf.clone()
        if root and emit is not None:
            emit(f"worker-{w}.safetensors", tensors)
        workers_meta[str(w)] = {
            "inner_state": has,
            "steps": got[w][1 : 1 + groups] if has and co.cfg.inner.optimizer == "adamw" else [],
            "scalars": got[w][3:7],
        }
    rng = torch.cat([x.to(torch.uint8).reshape(-1) for x in _rng_state()]).to(co.device)
    first = {co.comm.owner(w): w for w in reversed(range(co.cfg.algorithm.workers))}
    rngs = {}
    for q in sorted(first):
        got_rng = rng.clone()
        co.comm.fetch(got_rng, first[q])
        rngs[f"rank-{q}"] = got_rng.cpu()
    if not root:
        return {}
    if emit is not None:
        emit("rng.safetensors", rngs)
    return {
        "round": co.round,
        "parameters": co.n_params,
        "model": co.fingerprint(),
        "trainers": {str(t): {"request": tr.request} for t, tr in co.trainers.items()},
        "allocation": {str(w): t for w, t in co.allocation.items()},
        "b_max": {str(w): b for w, b in co.b_max.items()},
        "workers": workers_meta,
        "totals": dataclasses.asdict(co.totals),
        "initial_metrics": co.initial_metrics,
        "last_eval": {str(t): v for t, v in co.last_eval.items()},
        "last_accuracy": {str(t): v for t, v in co.last_accuracy.items()},
        "bad_rounds": co.bad_rounds,
        "elapsed_s": co.elapsed,
        "processes": co.comm.world,
    }


def restore_state(co: Coordinator, ck: Any) -> None:
    """Load a checkpoint (an :class:`adloco.checkpoint.Checkpoint`) into a freshly built coordinator."""
    from adloco.errors import UserError

    m = ck.meta
    where = f"checkpoint {str(ck.path)!r}"
    if m.get("parameters") != co.n_params or m.get("model") != co.fingerprint():
        raise UserError(
            f"{where}: holds a model of {m.get('parameters', 0):,} parameters with other shapes or names; this "
            f"run builds {co.n_params:,} ({co.cfg.model.name!r}): a run resumes with its own model"
        )
    if len(m["allocation"]) != co.cfg.algorithm.workers:
        raise UserError(
            f"{where}: written with {len(m['allocation'])} workers; this run has {co.cfg.algorithm.workers}"
        )
    co.round = int(m["round"])
    alive = sorted(int(t) for t in m["trainers"])
    co.trainers = {t: co.trainers[t] for t in alive}
    co.allocation = {int(w): int(t) for w, t in m["allocation"].items()}
    co.b_max = {int(w): int(b) for w, b in m["b_max"].items()}
    hosted = {co.allocation[w] for w in co.workers}
    for t, tr in co.trainers.items():
        tr.request = int(m["trainers"][str(t)]["request"])
        tr.outer = co._new_outer()
        tr.theta = None
        if t in hosted:
            ts = ck.tensors(f"trainer-{t}.safetensors")
            tr.theta = ts["theta"].to(co.device, torch.float32, copy=True)
            if "momentum" in ts and tr.outer.has_state:
                tr.outer.v = ts["momentum"].to(co.device, torch.float32, copy=True)
    for w, wk in co.workers.items():
        info = m["workers"][str(w)]
        state = dict(ck.tensors(f"worker-{w}.safetensors")) if info["inner_state"] else {}
        if state and info["steps"]:
            state["step"] = torch.tensor(info["steps"], dtype=torch.float32)
        wk.load_inner_state(state)
        wk.load_scalars(info["scalars"])
    co._load_workers()
    co.totals = Totals(**m["totals"])
    co.initial_metrics = dict(m["initial_metrics"])
    co.last_eval = {int(t): float(v) for t, v in m["last_eval"].items()}
    co.last_accuracy = {int(t): float(v) for t, v in m["last_accuracy"].items()}
    co.bad_rounds = int(m["bad_rounds"])
    co.elapsed = float(m["elapsed_s"])
    rngs = ck.tensors("rng.safetensors")
    mine = rngs.get(f"rank-{co.comm.rank}", rngs.get("rank-0"))
    if mine is not None and mine.numel() == sum(x.numel() for x in _rng_state()):
        sizes = [x.numel() for x in _rng_state()]
        _set_rng_state(list(torch.split(mine.to(torch.uint8), sizes)))


def _inner_keys(cfg: Config) -> list[str]:
    """The per-parameter buffers of the inner optimizer (their layout is the flat one)."""
    if cfg.inner.optimizer == "adamw":
        return ["exp_avg", "exp_avg_sq"]
    return ["momentum_buffer"] if cfg.inner.momentum > 0 else []


class DecisionMismatch(RuntimeError):
    """Processes computed different decisions from the same gathered scalars."""


class RoundStopped(Exception):
    """A signal stopped round ``round`` part-way; it was rolled back to its start on every process."""

    def __init__(self, round_: int) -> None:
        super().__init__(f"round {round_} stopped")
        self.round = round_


class TooManyBadRounds(RuntimeError):
    """``faults.max_bad_rounds`` consecutive rounds had a non-finite worker (θ itself stayed finite)."""


def _peak_memory(device: torch.device) -> int:
    """Peak memory of this process: CUDA allocations on a GPU, resident set size on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


def _rng_state() -> list[torch.Tensor]:
    """This process's torch generators (dropout draws from them): CPU, then its current CUDA device."""
    out = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out.append(torch.cuda.get_rng_state())
    return out


def _set_rng_state(states: list[torch.Tensor]) -> None:
    if not states:
        return
    torch.set_rng_state(states[0].contiguous())
    if len(states) > 1:
        torch.cuda.set_rng_state(states[1].contiguous())


def _num(x: float | None) -> float | None:
    """JSON-safe float: nan and inf become None."""
    return float(x) if x is not None and math.isfinite(x) else None
