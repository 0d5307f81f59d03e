"""What a round is made of: each worker's plan (and how it is made), what it reports, the totals, what
was communicated, and the report a round returns. Plain data and pure functions; :mod:`adloco.library.method`
runs the round."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from adloco import events
from adloco.library.algorithms import allocation, batching, switch
from adloco.library.comm.base import Comm, CommRecord
from adloco.library.replica import Probe
from adloco.library.settings import AdaptiveBatch, Switch


class RoundAborted(Exception):
    """A process asked to abort round ``round`` (``step_all(..., stop=True)``); every process raises it
    from the same collective, with the trainers' state untouched."""

    def __init__(self, round_: int) -> None:
        super().__init__(f"round {round_} aborted")
        self.round = round_


class DecisionMismatch(RuntimeError):
    """Processes computed different decisions from the same gathered scalars."""


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker does this round: which trainer it serves and how each inner step is cut."""

    worker: int
    trainer: int
    index: int  # its position among the trainer's workers: the data shard it reads
    of: int  # M: workers of the trainer
    request: int  # b
    micro: int  # rows per forward/backward
    accum: int  # micro-batches per optimizer step
    capped: bool  # the request was cut down to one micro-batch
    probe: Probe | None  # the gradient probe at the round's first step

    @property
    def effective(self) -> int:
        """Examples per inner step."""
        return self.micro * self.accum

    def rows(self, step: int) -> int:
        """Rows the ``step``-th inner step (0-based) needs: the step's, plus the probe's extra rows."""
        return self.effective + (self.probe.extra_rows if step == 0 and self.probe is not None else 0)


@dataclass
class WorkerRound:
    """What one worker reports after a round: scalars only, gathered as one float64 row per worker.

    The first ``STATS`` values are what the batch test needs (counted on the wire; one more, the entry
    sum, for the reference formula); the rest serve logging and bookkeeping and ride along uncounted."""

    k: int = 0
    c: int = 0
    sum_sq: float = math.nan
    mean_sq: float = math.nan
    sum_entries: float = math.nan
    has_stats: bool = False
    loss: float = math.nan
    steps: int = 0
    examples: int = 0
    probe_examples: int = 0
    finite: bool = True
    compute_s: float = 0.0
    micro: int = 0
    accum: int = 0
    capped: bool = False
    skipped: int = 0
    aborted: bool = False
    b_max: int = 0
    lr: float = math.nan  # the lr of the worker's last step, its trainer's multiplier included
    lr_scale: float = 1.0  # that multiplier

    STATS = 4

    def to_row(self) -> list[float]:
        return [float(getattr(self, f.name)) for f in dataclasses.fields(self)]

    @classmethod
    def from_row(cls, row: Sequence[float]) -> WorkerRound:
        kw = {}
        for f, v in zip(dataclasses.fields(cls), row, strict=True):
            kw[f.name] = {"int": int, "bool": bool}.get(str(f.type), float)(v)
        return cls(**kw)

    @property
    def stats(self) -> batching.WorkerStats | None:
        if not self.has_stats:
            return None
        return batching.WorkerStats(self.k, self.c, self.sum_sq, self.mean_sq, sum_entries=self.sum_entries)


WIDTH = len(dataclasses.fields(WorkerRound))


@dataclass
class Gathered:
    """What phase 1 of a round's end gathered (ALGORITHM.md §6), which the later phases read: every
    trainer's workers and every worker's trainer as the round ran, every worker's results, and the fault
    events."""

    members: dict[int, list[int]]
    trainer_of: dict[int, int]
    results: dict[int, WorkerRound]
    faults: list[events.Fault]

    @property
    def ok(self) -> dict[int, list[int]]:
        """Every trainer's finite workers (those that take part in its outer step and batch test)."""
        return {t: [w for w in ws if self.results[w].finite] for t, ws in sorted(self.members.items())}

    @property
    def examples(self) -> dict[int, int]:
        """Every worker's examples of the round's steps (what weights its Δ)."""
        return {w: res.examples for w, res in self.results.items()}


@dataclass
class Totals:
    examples: int | None = 0  # None: the hooked form never saw the rows of a step
    bytes: int = 0
    messages: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def count(self, results: Iterable[WorkerRound], known: bool) -> int:
        """A round's training examples read (the steps' and the probe's extra rows: a budget counts both),
        added to ``examples`` (None from the first round whose rows were not ``known``); returns them."""
        examples = sum(res.examples + res.probe_examples for res in results)
        if known and self.examples is not None:
            self.examples += examples
        else:  # the hooked mode without a batch size: the rows of a step were never seen
            self.examples = None
        return examples


@dataclass
class Traffic:
    """What was communicated since the last count: bytes on the wire, messages, this process's seconds in
    the collectives on its critical path (waits for what ran behind compute included), and the counted
    collectives as ``[kind, op, n, payload bytes, count, workers]`` rows; those that ran behind the workers'
    compute (``sync.overlap``, streaming) apart, as ``[..., count, share]`` rows (the share of a round's
    compute each ran behind), with the seconds they took there."""

    bytes: int = 0
    messages: int = 0
    comm_s: float = 0.0
    collectives: list[list[Any]] = field(default_factory=list)
    behind: list[list[Any]] = field(default_factory=list)
    behind_s: float = 0.0
    wait_s: float = 0.0  # of comm_s, the seconds spent waiting for what ran behind

    @classmethod
    def count(cls, recs: Sequence[CommRecord], waited: float, totals: Totals) -> Traffic:
        """The traffic of the collectives ``recs`` (and ``waited`` seconds waited for what ran behind),
        added to ``totals``. Collectives in the way are ``[kind, op, n, payload, count, workers]`` rows in
        the order they were issued; a collective joins an earlier row of its kind and workers when no
        collective between them touched one of those workers, so the rows keep what the network model
        schedules on (ALGORITHM.md §7) however many steps a round has."""
        nbytes = sum(r.wire for r in recs)
        msgs = sum(1 for r in recs if r.workers > 1)
        totals.bytes += nbytes
        totals.messages += msgs
        rows: list[list[Any]] = []
        last: dict[int, int] = {}  # worker -> index of the last row that held it
        behind: dict[tuple[str, str, int, int, float], int] = {}
        for rec in recs:
            totals.by_kind[rec.kind] = totals.by_kind.get(rec.kind, 0) + rec.wire
            if rec.workers <= 1:
                continue
            if rec.behind:
                key = (rec.kind, rec.op, rec.workers, rec.payload, rec.behind)
                behind[key] = behind.get(key, 0) + 1
                continue
            head = [rec.kind, rec.op, rec.workers, rec.payload]
            if not rec.group:  # a record that names no workers (a checkpoint's, from before): holds all
                if rows and len(rows[-1]) == 5 and rows[-1][:4] == head:
                    rows[-1][4] += 1
                else:
                    rows.append([*head, 1])
                    last = dict.fromkeys(last, len(rows) - 1)
                continue
            group = sorted(rec.group)
            at = {last.get(w) for w in group}
            i = at.pop() if len(at) == 1 else None
            if i is not None and rows[i][:4] == head and rows[i][5:] == [group]:
                rows[i][4] += 1
                continue
            rows.append([*head, 1, group])
            for w in group:
                last[w] = len(rows) - 1
        return cls(
            nbytes,
            msgs,
            sum(r.seconds for r in recs if not r.behind) + waited,
            rows,
            [[*k[:4], c, k[4]] for k, c in behind.items()],
            sum(r.seconds for r in recs if r.behind),
            waited,
        )


Regrouped = tuple[events.Merge | None, events.Allocation | None]  # phase 4's events (None: no merge)


@dataclass
class RoundReport:
    """What one round did, as the typed events of :mod:`adloco.events` plus the round's numbers."""

    round: int  # 1-based: the round just completed
    workers: list[events.Worker]
    trainers: list[events.Trainer]
    faults: list[events.Fault]
    merge: events.Merge | None
    allocation: events.Allocation | None
    switch_mode: str
    examples: int | None
    loss: float | None
    bytes: int
    messages: int
    comm_s: float  # this process's time in counted collectives, waits included
    collectives: list[list[Any]]  # [kind, op, n, payload bytes, count, workers], counted ones only
    compute_s: dict[int, float]  # every worker's compute time this round
    idle_share: float = 0.0  # mean over trainers of 1 − mean/max of their workers' compute times
    behind: list[list[Any]] = field(default_factory=list)  # collectives run behind this round's compute
    behind_s: float = 0.0  # the seconds they took on the background lane
    wait_s: float = 0.0  # of comm_s, the seconds the round waited for them

    @classmethod
    def of(
        cls,
        round_: int,
        gathered: Gathered,
        trainer_events: list[events.Trainer],
        regrouped: Regrouped,
        switch_mode: str,
        examples: int,
        traffic: Traffic,
        known: bool,
    ) -> RoundReport:
        """The report of round ``round_`` from what phase 1 gathered, the trainers' events, the merge and
        allocation events, and its traffic; ``known``: whether the rows of a step were seen (not in the
        hooked form without a batch size)."""
        results, trainer_of, fault_events = gathered.results, gathered.trainer_of, gathered.faults
        merge_event, alloc_event = regrouped
        worker_events = [
            events.Worker(
                round=round_,
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
        return cls(
            round=round_,
            workers=worker_events,
            trainers=trainer_events,
            faults=fault_events,
            merge=merge_event,
            allocation=alloc_event,
            switch_mode=switch_mode,
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

    def events(self) -> list[events.Event]:
        """Worker, fault, trainer, merge and allocation events, in that order."""
        out: list[events.Event] = [*self.workers, *self.faults, *self.trainers]
        out += [e for e in (self.merge, self.allocation) if e is not None]
        return out


class Clock:
    """Compute time of one worker: host clock on CPU, CUDA events on a GPU (no synchronization per step)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.cpu_s = 0.0
        self.slept = 0.0
        self.pairs: list[tuple[Any, Any]] = []
        self._t0 = 0.0
        self._ev: Any = None

    def start(self) -> None:
        self._t0 = time.perf_counter()
        if self.cuda:
            self._ev = torch.cuda.Event(enable_timing=True)
            self._ev.record()

    def stretch(self, speed: float) -> None:
        """Emulate a device ``speed`` times as fast: sleep until this step took 1/speed as long."""
        if speed >= 1.0:
            return
        if self.cuda:
            torch.cuda.synchronize()
        pause = (time.perf_counter() - self._t0) * (1.0 / speed - 1.0)
        time.sleep(pause)
        if self.cuda:
            self.slept += pause  # CUDA events do not see the host's sleep

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.pairs.append((self._ev, end))
        else:
            self.cpu_s += time.perf_counter() - self._t0

    def seconds(self) -> float:
        if not self.cuda:
            return self.cpu_s
        torch.cuda.synchronize()
        return sum(a.elapsed_time(b) for a, b in self.pairs) / 1000.0 + self.slept


@dataclass
class WorkerProgress:
    """A local worker's bookkeeping within the current round."""

    clock: Clock
    loss: torch.Tensor | None = None  # sum of step losses (None when the user's loop runs the steps)
    steps: int = 0
    examples: int = 0
    probe_examples: int = 0
    stats: batching.WorkerStats | None = None
    skipped_before: int = 0


def check_agreement(
    comm: Comm, round_: int, requests: Mapping[int, int], allocation: Mapping[int, int], local: Sequence[int]
) -> None:
    """Every process must have made the same decisions: a hash of them compared (not counted); a
    disagreement raises :class:`DecisionMismatch` on every process."""
    state = [round_, dict(requests), sorted(allocation.items())]
    digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
    h = float(int(digest[:13], 16))  # 52 bits: exact in a float64
    got = comm.all_gather_rows({w: [h] for w in local}, 1, "check", counted=0)
    ranks: dict[float, set[int]] = {}
    for w, (v,) in got.items():
        ranks.setdefault(v, set()).add(comm.owner(w))
    if len(ranks) > 1:
        groups = " vs ".join("ranks " + ",".join(map(str, sorted(x))) for x in ranks.values())
        raise DecisionMismatch(
            f"round {round_}: processes disagree on requests, merges or allocation ({groups}); "
            "this is a bug or non-deterministic arithmetic, please report it with the run directory"
        )


def measured_speed(res: WorkerRound, fixed: float = 0.0) -> float:
    """A worker's speed over a round: its rows (training and probe) per second, each forward and backward
    pass counted as ``fixed`` rows more (a pass's fixed cost, α/β of a step-time profile, ALGORITHM.md
    §11), so that a worker's speed does not depend on the share it was given; 0 when it did not compute."""
    if res.compute_s <= 0 or res.examples <= 0:
        return 0.0
    passes = res.steps * max(res.accum, 1)
    if res.probe_examples and res.micro:
        passes += -(-res.probe_examples // res.micro)
    return (res.examples + res.probe_examples + fixed * passes) / res.compute_s


def relative_speeds(speed: Mapping[int, float], workers: Sequence[int]) -> dict[int, float] | None:
    """Workers' measured speeds relative to the fastest, in steps of 1/8 (ALGORITHM.md §9.3), or None for
    equal shares: before every worker was measured, and when the slowest is within 20% of the fastest
    (timing noise must never change a run)."""
    if len(workers) < 2 or any(w not in speed for w in workers):
        return None
    top = max(speed[w] for w in workers)
    rel = {w: speed[w] / top for w in workers}
    if min(rel.values()) > 0.8:
        return None
    return {w: max(1, round(8 * r)) / 8 for w, r in rel.items()}


def plan_round(
    requests: Mapping[int, int],
    members: Mapping[int, Sequence[int]],
    b_max: Mapping[int, int],
    mode: str,
    sw: Switch,
    batch: AdaptiveBatch,
    speeds: Mapping[int, Mapping[int, float] | None],
    fixed: float = 0.0,
) -> dict[int, WorkerPlan]:
    """Every worker's plan for a round: trainer t's M·b_t examples per inner step shared among its M
    workers (equally, or by ``speeds[t]`` with a step's ``fixed`` cost in rows), each share cut into micro-batches by switch mode against the
    worker's own b_max (ALGORITHM.md §5, ALGORITHM.md §9.3), and the pooled probe's chunks: one chunk size c per trainer
    (from its smallest step), a worker with a larger share contributing more chunks of c, up to
    probe_chunks, so the pooled statistics stay exact (ALGORITHM.md §2.5)."""
    share: dict[int, int] = {}  # examples per step each worker is asked for
    for t, ws in members.items():
        sp = speeds.get(t)
        share.update(
            allocation.split(len(ws) * requests[t], sp, fixed) if sp else dict.fromkeys(ws, requests[t])
        )
    cut = {w: switch.plan(share[w], b_max[w], mode, sw.kappa) for w in share}
    probes: dict[int, Probe] = {}
    if batch.estimator == "pooled" and batch.probing:
        need_p = batch.test in ("inner_product", "augmented_inner_product")
        shared = batching.needs_shared_mean(batch.test, batch.estimator, batch.exact_mean)
        keep = "chunks" if need_p else ("sum" if shared else "none")
        for ws in members.values():
            k, c, extra = batching.probe_layout([cut[w].effective for w in ws], batch.probe_chunks)
            for w in ws:
                k_w = k if extra else max(1, min(cut[w].effective // c, batch.probe_chunks))
                probes[w] = Probe(k_w, c, extra, keep)
    return {
        w: WorkerPlan(
            w,
            t,
            list(ws).index(w),
            len(ws),
            requests[t],
            cut[w].micro,
            cut[w].accum,
            cut[w].capped,
            probes.get(w),
        )
        for t, ws in members.items()
        for w in ws
    }
