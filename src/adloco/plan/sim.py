"""A run priced before it is rented: N workers, their links, their devices and their failures.

Nothing here is a second model of what the engine does. A round's collectives are the rows the engine logs
(``[kind, op, n, payload, count, workers]``, ALGORITHM.md §7): Δ per trainer through the wire's codec,
whose collective and exact bytes are :func:`adloco.library.comm.compressed.collective`'s (ALGORITHM.md §9.4);
DDP's gradients every step; AdLoCo's batch statistics among every worker; streaming fragments cut by
:func:`adloco.library.streaming.fragments` and behind their τ steps, ``sync.overlap`` behind the next round's
compute (ALGORITHM.md §13). They are priced by :mod:`adloco.netmodel` (the links, the sites, the schedule
in issue order: :func:`adloco.netmodel.round_time`), compute by a :class:`adloco.profile.StepProfile`
(ALGORITHM.md §11), a trainer's rows shared by speed by :func:`adloco.library.algorithms.allocation.split`
(ALGORITHM.md §9.3), and a worker that rejoins is sent θ as the engine moves it (a ``move`` broadcast of
θ and the outer momentum on ``comm.theta_dtype``'s wire). A failure under the elastic policy restarts every
process and resumes from the newest checkpoint, losing the rounds since (ALGORITHM.md §9.2; the engine's
``adloco train --max-restarts``); under ``live`` recovery a lost worker costs its own round and its
restart while the others go on. The clock of rounds, failures, restarts and joins is a SimPy
environment: one process trains round after round, one draws failures, one brings joiners.

What is left out: AdLoCo's merges and moves and its growing requests (what its gradients decide; a run
is priced at its start, K trainers at ``batch.initial``), the batch test's extra probe passes, and
contention between collectives that share a link at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from adloco import netmodel
from adloco.library.settings import FLOAT32, AdaptiveBatch, Method, Sync, Wire
from adloco.profile import StepProfile

Recovery = Literal["restart", "live"]
RESTART_S = 10.5  # the measured restart (benchmarks/RESULTS.md, "Runs that survive failures")


@dataclass(frozen=True)
class Device:
    """What one worker's inner step costs: a step-time profile t(m, a) = a·(α + β·m) + δ (ALGORITHM.md §11),
    ``rows`` per worker and step (``batch.initial``), at most ``b_max`` rows a micro-batch (more are
    accumulated)."""

    profile: StepProfile
    rows: int
    b_max: int

    @classmethod
    def of_step(cls, seconds: float, rows: int = 1) -> Device:
        """A device that takes ``seconds`` for an inner step of ``rows`` rows, all of it per row."""
        return cls(StepProfile(0.0, seconds / rows, 0.0, source=f"{seconds:g} s a step"), rows, rows)

    def step_seconds(self, rows: int) -> float:
        """One inner step of ``rows`` rows: accumulated in ⌈rows / b_max⌉ micro-batches."""
        accum = max(1, -(-rows // self.b_max))
        return self.profile.step_seconds(-(-rows // accum), accum)


@dataclass(frozen=True)
class Failures:
    """Per-worker failures, drawn as a Poisson process (each worker fails after an exponential time of mean
    ``mtbf_s``; None: never), and what a failure costs. ``restart``: every process restarts (``restart_s``)
    and resumes from the newest checkpoint, written every ``checkpoint_every`` rounds for ``checkpoint_s``
    seconds of waiting each; ``live``: the lost worker's round is dropped, it comes back ``restart_s`` later
    and is sent θ at the next round's start, the others never stop. ``joins``: seconds at which a worker
    joins (a restart of every process under ``restart``, θ sent to it under ``live``)."""

    mtbf_s: float | None = None
    restart_s: float = RESTART_S
    recovery: Recovery = "restart"
    checkpoint_every: int = 1
    checkpoint_s: float = 0.0
    joins: tuple[float, ...] = ()


@dataclass(frozen=True)
class Setup:
    """A run to price: ``method`` on ``workers`` workers of a ``parameters``-value model, ``trainers``
    trainers (AdLoCo; the baselines have one), H = ``inner_steps``, the ``wire`` (the codec), ``sync``
    (overlap, fragments), AdLoCo's ``batch`` dial (whether its statistics travel), the ``device``, the links
    ``net``, relative compute ``speeds`` (worker w's is ``speeds[w mod len]``; empty: all 1) and whether
    rows follow them (``balance``), ``ddp_overlap`` (the share of a step DDP's all-reduce hides behind: 0
    for the engine's DDP, which reduces after the backward pass; 2/3 for one that reduces behind it),
    ``rounds`` to commit, ``failures`` and the ``seed`` of their draw, and whether the outer step keeps a
    ``momentum`` (sent with θ to a worker that joins)."""

    method: Method
    workers: int
    parameters: int
    device: Device
    net: netmodel.Model
    inner_steps: int = 12
    trainers: int = 1
    wire: Wire = FLOAT32
    batch: AdaptiveBatch = field(default_factory=AdaptiveBatch)
    speeds: tuple[float, ...] = ()
    balance: Literal["equal", "speed"] = "equal"
    ddp_overlap: float = 0.0
    rounds: int = 100
    failures: Failures = field(default_factory=Failures)
    seed: int = 0
    momentum: bool | None = None  # the outer step keeps a momentum (moved with θ); None: the method's preset
    sync: Sync = field(default_factory=Sync)  # when Δ travels: overlap, streaming fragments

    def speed(self, w: int) -> float:
        """Worker ``w``'s relative compute speed."""
        return self.speeds[w % len(self.speeds)] if self.speeds else 1.0


@dataclass(frozen=True)
class Round:
    """One round of a set of workers, failure-free: each worker's compute, the collectives in the way
    (``rows``) and behind (``behind``), and when the round ends."""

    compute: dict[int, float]
    rows: list[list[Any]]
    behind: list[list[Any]]
    seconds: float
    bytes: int

    @property
    def utilization(self) -> float:
        """The share of the round the workers compute, on average."""
        return sum(self.compute.values()) / (len(self.compute) * self.seconds) if self.seconds > 0 else 1.0

    @property
    def comm_s(self) -> float:
        """What the round spends beyond its slowest worker's compute."""
        return self.seconds - max(self.compute.values(), default=0.0)

    def idle(self) -> dict[int, float]:
        """Each worker's share of the round not computing (waiting for the slowest, or communicating)."""
        return {w: 1.0 - c / self.seconds if self.seconds > 0 else 0.0 for w, c in self.compute.items()}


@dataclass
class Timeline:
    """The run on the clock, failures and all."""

    wall_s: float = 0.0
    rounds: int = 0  # committed
    useful_s: float = 0.0  # worker-seconds of compute in committed rounds
    rented_s: float = 0.0  # worker-seconds of machines held
    failures: int = 0
    restarts: int = 0
    rounds_lost: int = 0
    joins: int = 0
    stalled: bool = False  # stopped at the time limit before every round was committed

    @property
    def goodput(self) -> float:
        """Useful compute over the machines' time: what failures and communication leave."""
        return self.useful_s / self.rented_s if self.rented_s > 0 else 0.0


@dataclass
class Simulation:
    """What :func:`simulate` found: the failure-free round and the run on the clock."""

    setup: Setup
    round: Round
    timeline: Timeline

    @property
    def utilization(self) -> float:
        """The failure-free round's compute utilization."""
        return self.round.utilization

    @property
    def goodput(self) -> float:
        """Useful compute over the machines' time, failures and all."""
        return self.timeline.goodput

    def to_dict(self) -> dict[str, Any]:
        """The numbers, as ``--json`` writes them."""
        s, r, t = self.setup, self.round, self.timeline
        idle = r.idle()
        return {
            "method": s.method,
            "workers": s.workers,
            "parameters": s.parameters,
            "wire": s.wire.dtype,
            "inner_steps": s.inner_steps,
            "round_s": r.seconds,
            "compute_s": max(r.compute.values()),
            "comm_s": r.comm_s,
            "bytes_per_round": r.bytes,
            "utilization": r.utilization,
            "idle_share": {"mean": sum(idle.values()) / len(idle), "max": max(idle.values())},
            "collectives": r.rows,
            "collectives_behind": r.behind,
            "wall_s": t.wall_s,
            "rounds": t.rounds,
            "goodput": t.goodput,
            "failures": t.failures,
            "restarts": t.restarts,
            "rounds_lost": t.rounds_lost,
            "joins": t.joins,
            "stalled": t.stalled,
        }


# --------------------------------------------------------------------------------------------------
# A round: the engine's rows, priced by netmodel
# --------------------------------------------------------------------------------------------------


def groups(workers: Sequence[int], trainers: int) -> list[list[int]]:
    """The trainers' workers: contiguous, near-equal (the engine's first allocation)."""
    from adloco.library.streaming import fragments

    ws = list(workers)
    return [ws[sl] for sl in fragments(len(ws), min(trainers, len(ws)))]


def _reduce(kind: str, numel: int, group: list[int], wire: Wire, count: int) -> list[Any]:
    """The row of one reduction of ``numel`` values among ``group`` through ``wire`` (the engine's
    ``Comm.reduce``: float32's plain all-reduce, or the codec's collective of its exact bytes)."""
    from adloco.library.comm.codecs import of
    from adloco.library.comm.compressed import collective

    codec = of(wire)
    op, payload = ("all_reduce", 4 * numel) if codec is None else collective(numel, len(group), codec)
    return [kind, op, len(group), payload, count, list(group)]


def _merge(rows: list[list[Any]]) -> list[list[Any]]:
    """Consecutive equal rows as one with their counts added (as the engine logs them)."""
    out: list[list[Any]] = []
    for r in rows:
        if out and out[-1][:4] == r[:4] and out[-1][5:] == r[5:]:
            out[-1][4] += r[4]
        else:
            out.append(list(r))
    return out


def round_rows(s: Setup, workers: Sequence[int]) -> tuple[list[list[Any]], list[list[Any]]]:
    """The collectives of one round among ``workers``, as the engine logs them: (in the way, behind)."""
    from adloco.library.algorithms.batching import needs_shared_mean
    from adloco.library.round import WorkerRound
    from adloco.library.streaming import fragments

    ws = sorted(workers)
    rows: list[list[Any]] = []
    behind: list[list[Any]] = []
    P, H, w, sync = s.parameters, s.inner_steps, s.wire, s.sync
    trainers = groups(ws, 1 if s.method != "adloco" else s.trainers)
    if s.method == "adloco" and s.batch.probing and len(ws) > 1:
        counted = WorkerRound.STATS + (s.batch.formula == "reference")
        rows.append(["stats", "all_gather", len(ws), 8 * counted, 1, ws])
        if needs_shared_mean(s.batch.test, s.batch.estimator, s.batch.exact_mean):
            rows += [_reduce("probe", P, g, w, 1) for g in trainers if len(g) > 1]
            need_p = s.batch.test in ("inner_product", "augmented_inner_product")
            rows.append(["stats", "all_gather", len(ws), 8 * (3 if need_p else 1), 1, ws])
    for g in (g for g in trainers if len(g) > 1):
        if s.method == "ddp":
            row = _reduce("grad", P, g, w, H)
            if s.ddp_overlap > 0:  # each step's all-reduce behind that step's backward pass
                behind.append([*row[:5], s.ddp_overlap / H])
            else:
                rows.append(row)
            continue
        parts = [_reduce("delta", sl.stop - sl.start, g, w, 1) for sl in fragments(P, sync.fragments)]
        if sync.overlap != "none":  # launched at the round's end, landed behind the next round's compute
            behind += [[*r[:5], 1.0] for r in parts]
        elif sync.fragments > 1 and sync.fragment_delay > 0:  # each behind its own τ steps
            behind += [[*r[:5], sync.fragment_delay / H] for r in parts]
        else:
            rows += parts
    return _merge(rows), _merge(behind)


def price(s: Setup, workers: Sequence[int], joiners: Sequence[int] = ()) -> Round:
    """One round of ``workers`` (``joiners`` among them sent θ at its start), failure-free."""
    from adloco.library.algorithms.allocation import split
    from adloco.library.comm.base import wire_bytes

    ws = sorted(workers)
    rows, behind = round_rows(s, ws)
    if joiners:  # each joiner is sent θ by a different member, side by side (sources in turn)
        sources = [w for w in ws if w not in joiners] or ws[:1]
        moves = [
            _move(s, sources[i % len(sources)], j) for i, j in enumerate(sorted(joiners)) if j not in sources
        ]
        rows = [*moves, *rows]
    rows_of = {w: s.device.rows for w in ws}
    if s.balance == "speed" and s.method != "ddp":
        prof = s.device.profile
        fixed = prof.alpha / prof.beta if prof.beta > 0 else 0.0
        for g in groups(ws, 1 if s.method != "adloco" else s.trainers):
            if len({s.speed(w) for w in g}) > 1:
                rows_of.update(split(len(g) * s.device.rows, {w: s.speed(w) for w in g}, fixed))
    compute = {w: s.inner_steps * s.device.step_seconds(rows_of[w]) / s.speed(w) for w in ws}
    took = netmodel.round_time(compute, rows, 1.0, 0.0, behind=behind, net=s.net)
    sent = sum(int(r[4]) * wire_bytes(str(r[1]), int(r[2]), int(r[3])) for r in [*rows, *behind])
    return Round(compute, rows, behind, took.seconds, sent)


def _move(s: Setup, src: int, to: int) -> list[Any]:
    """θ (and the outer momentum, where the outer step keeps one) to a worker that (re)joins: one broadcast
    of θ's wire (``comm.theta_dtype``) from a worker that holds it (the engine's ``move``)."""
    from adloco.library.comm.codecs import of
    from adloco.library.presets import preset_values

    codec = of(s.wire.theta)
    payload = 4 * s.parameters if codec is None else codec.nbytes(s.parameters)
    momentum = s.momentum
    if momentum is None:
        momentum = preset_values(s.method, "outer", dtype=s.wire.dtype).get("optimizer") == "nesterov"
    count = 2 if momentum else 1
    return ["move", "broadcast", 2, payload, count, [src, to]]


# --------------------------------------------------------------------------------------------------
# The clock: rounds, failures, restarts, joins (SimPy)
# --------------------------------------------------------------------------------------------------


def simulate(s: Setup, limit_s: float | None = None) -> Simulation:
    """Price ``s``: its failure-free round, and its ``rounds`` on the clock with its failures and joins.

    ``limit_s``: simulated seconds after which the run stops unfinished (``Timeline.stalled``; default:
    a thousand times the failure-free run, where failures come faster than rounds end)."""
    try:
        import simpy
    except ImportError:  # a dependency of adloco: missing only from a broken install
        from adloco.errors import UserError

        raise UserError("adloco simulate needs SimPy: pip install simpy") from None

    first = price(s, range(s.workers))
    tl = Timeline()
    env = simpy.Environment()
    rng = random.Random(s.seed)
    f = s.failures
    members = list(range(s.workers))
    held: dict[str, float] = {"since": 0.0, "n": s.workers}  # machines held since, for rented_s
    cache: dict[tuple[int, ...], Round] = {}
    state: dict[str, Any] = {"restarting": False, "failed": set(), "joiners": []}
    back: list[tuple[float, int]] = []  # live: (when, worker) of lost workers coming back
    limit = limit_s if limit_s is not None else 1000.0 * max(first.seconds, 1e-9) * s.rounds + sum(f.joins)

    def hold(n: float) -> None:
        tl.rented_s += held["n"] * (env.now - held["since"])
        held.update(since=env.now, n=n)

    def priced(ws: list[int], joiners: list[int]) -> Round:
        key = (*ws, -1, *joiners)
        if key not in cache:
            if len(cache) > 64:
                cache.clear()
            cache[key] = price(s, ws, joiners)
        return cache[key]

    def train() -> Any:
        ckpt: dict[str, Any] = {"rounds": 0, "since": []}  # committed at the newest checkpoint; compute since

        def restart(cause: str) -> Any:
            """Every process restarts and resumes from the newest checkpoint (ALGORITHM.md §9.2)."""
            tl.restarts += 1
            tl.rounds_lost += tl.rounds - ckpt["rounds"] + (cause != "pending")
            tl.useful_s -= sum(ckpt["since"])
            tl.rounds, ckpt["since"] = ckpt["rounds"], []
            state["restarting"] = True
            for _ in range(state.pop("joining", 0)):
                members.append(max(members) + 1)
            hold(len(members))
            yield env.timeout(f.restart_s)
            state["restarting"] = False

        while tl.rounds < s.rounds:
            if state.pop("pending", False):  # a failure or a join while no round was in flight
                yield from restart("pending")
                continue
            ready = sorted(w for when, w in back if when <= env.now)
            back[:] = [b for b in back if b[1] not in ready]
            joiners = sorted(set(ready) | set(state["joiners"]))
            state["joiners"] = []
            members.extend(j for j in joiners if j not in members)
            members.sort()
            r = priced(members, joiners)
            state["failed"] = set()
            state["in_round"] = True
            try:
                yield env.timeout(r.seconds)
            except simpy.Interrupt as stop:
                state["in_round"] = False
                yield from restart(str(stop.cause))
                continue
            state["in_round"] = False
            useful = sum(c for w, c in r.compute.items() if w not in state["failed"])
            tl.useful_s += useful
            tl.rounds += 1
            ckpt["since"].append(useful)
            if f.recovery == "restart" and tl.rounds % f.checkpoint_every == 0:
                if f.checkpoint_s > 0:
                    yield env.timeout(f.checkpoint_s)
                ckpt["rounds"], ckpt["since"] = tl.rounds, []
        tl.wall_s = env.now

    def stop(trainer: Any, cause: str) -> None:
        """restart: the round in flight ends everywhere; between rounds, at the next one's start."""
        if cause == "join":
            state["joining"] = state.get("joining", 0) + 1
        if state["restarting"]:
            return
        if state.get("in_round"):
            trainer.interrupt(cause)
        else:
            state["pending"] = True

    def failures(trainer: Any) -> Any:
        assert f.mtbf_s is not None
        while True:
            alive = len(members) + len(back)
            yield env.timeout(rng.expovariate(alive / f.mtbf_s))
            tl.failures += 1
            if f.recovery == "restart":
                stop(trainer, "failure")
                continue
            if len(members) <= 1:  # the last worker: nothing goes on without it
                continue
            w = rng.choice(members)
            members.remove(w)
            state["failed"].add(w)
            back.append((env.now + f.restart_s, w))

    def joins(trainer: Any) -> Any:
        for t in sorted(f.joins):
            yield env.timeout(max(0.0, t - env.now))
            tl.joins += 1
            if f.recovery == "restart":
                stop(trainer, "join")  # the joiner comes in with the restart
            else:
                new = max([*members, *(w for _, w in back)]) + 1
                state["joiners"].append(new)
                hold(held["n"] + 1)

    trainer = env.process(train())
    if f.mtbf_s is not None:
        env.process(failures(trainer))
    if f.joins:
        env.process(joins(trainer))
    env.run(until=simpy.AnyOf(env, [trainer, env.timeout(limit)]))
    if trainer.is_alive:
        tl.stalled, tl.wall_s = True, env.now
    hold(held["n"])
    return Simulation(s, first, tl)


# --------------------------------------------------------------------------------------------------
# Sweeps
# --------------------------------------------------------------------------------------------------


def scaled(net: netmodel.Model, factor: float) -> netmodel.Model:
    """The same links, every bandwidth times ``factor``."""
    if isinstance(net, netmodel.Link):
        return netmodel.Link(net.bandwidth * factor, net.latency)
    up = None if net.upload is None else net.upload * factor
    wan = None if net.site_bandwidth is None else net.site_bandwidth * factor
    return replace(net, bandwidth=net.bandwidth * factor, upload=up, site_bandwidth=wan)


def bandwidth_for(s: Setup, utilization: float, of: Callable[[netmodel.Model], float] | None = None) -> float:
    """The bandwidth (bytes/s, of ``s.net``'s workers' links, every other bandwidth scaled with it) at which
    the failure-free round reaches ``utilization``: bisection on a log scale; ``inf`` where no bandwidth
    does (latency alone is too much)."""
    base = s.net.bandwidth

    def util(bw: float) -> float:
        return price(replace(s, net=scaled(s.net, bw / base)), range(s.workers)).utilization

    lo, hi = 1.0, 1e15
    if util(hi) < utilization:
        return math.inf
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if util(mid) < utilization else (lo, mid)
        if hi / lo < 1 + 1e-6:
            break
    return hi


def sweep(
    s: Any, workers: list[int] | None = None, mbits: list[float] | None = None
) -> list[dict[str, float]]:
    """The failure-free round at each number of workers (the network's sites dropped where they no longer
    sum to N) or each link bandwidth (every bandwidth scaled)."""
    out = []
    for n in workers or []:
        net = s.net
        if isinstance(net, netmodel.Network) and len(net.sites) > 1 and sum(net.sites) != n:
            net = replace(net, sites=())
        one = replace(s, workers=n, net=net)
        r = price(one, range(n))
        out.append({"workers": n, "utilization": r.utilization, "round_s": r.seconds, "bytes": r.bytes})
    for mb in mbits or []:
        one = replace(s, net=scaled(s.net, mb * 1e6 / 8 / s.net.bandwidth))
        r = price(one, range(s.workers))
        out.append({"mbits": mb, "utilization": r.utilization, "round_s": r.seconds, "bytes": r.bytes})
    return out
