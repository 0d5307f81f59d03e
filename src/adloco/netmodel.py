"""Simulated wall time (ALGORITHM.md §7): measured compute plus each collective's cost on a modelled network.

A collective among n workers of a payload of B bytes each, on links of bandwidth β (bytes/s) and
latency α (s):
  all_reduce (ring):      2(n−1)/n · B/β + 2(n−1)·α
  broadcast (pipelined):  B/β + ⌈log2 n⌉·α
  all_gather (ring):      (n−1) · B/β + (n−1)·α
A round's simulated time is when its last worker is done, each worker having its own link: a worker
computes (its compute time divided by its speed), then takes part in the round's counted collectives
in the order the engine issued them; a collective starts when the last of its workers is free and holds
all of them for its time. Collectives of disjoint workers (trainers' own Δ) overlap; one among all
workers (the batch statistics) waits for every worker. A row that does not name its workers (runs
recorded before rows did) is taken to hold every worker: the slowest compute plus every collective one
after another. A collective run behind the round's compute (``comm.overlap``) costs max(0, its time −
that compute) (ALGORITHM.md §13).

A :class:`Link` is the same model handed to a communicator: with ``network.emulate`` every counted
collective is held back until its wall time is what the model says (:attr:`adloco.comm.Comm.link`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def collective_seconds(op: str, n: int, payload: int, bandwidth: float, latency: float) -> float:
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n * payload / bandwidth + 2 * (n - 1) * latency
    if op == "broadcast":
        return payload / bandwidth + math.ceil(math.log2(n)) * latency
    if op == "all_gather":
        return (n - 1) * payload / bandwidth + (n - 1) * latency
    raise ValueError(f"unknown collective {op!r}")


@dataclass(frozen=True)
class Link:
    """The modelled link: ``bandwidth`` bytes per second (> 0) and ``latency`` seconds per hop (>= 0)."""

    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        if not (_number(self.bandwidth) and self.bandwidth > 0):
            raise ValueError(
                f"link: bandwidth {self.bandwidth!r} must be a finite number > 0 (bytes per second)"
            )
        if not (_number(self.latency) and self.latency >= 0):
            raise ValueError(f"link: latency {self.latency!r} must be a finite number >= 0 (seconds)")

    def seconds(self, op: str, n: int, payload: int) -> float:
        """A collective's modelled time on this link (:func:`collective_seconds`)."""
        return collective_seconds(op, n, payload, self.bandwidth, self.latency)


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def comm_seconds(collectives: Iterable[Sequence[Any]], bandwidth: float, latency: float) -> float:
    """Total cost of ``[kind, op, n, payload, count]`` rows (as logged in a round event; a sixth element,
    the workers, is ignored): every collective one after another."""
    total = 0.0
    for _kind, op, n, payload, count, *_ in collectives:
        total += int(count) * collective_seconds(str(op), int(n), int(payload), bandwidth, latency)
    return total


def schedule_seconds(
    start: Mapping[int, float], collectives: Iterable[Sequence[Any]], bandwidth: float, latency: float
) -> float:
    """When the last worker is done: each worker free at ``start[w]``, then the ``[kind, op, n, payload,
    count, workers]`` rows in order, each starting when the last of its workers is free and holding them
    ``count`` times its cost. A row without its ``workers`` holds every worker of ``start`` and every
    worker any row named."""
    clock = dict(start) or {-1: 0.0}  # no worker computed: a worker that only communicates
    rows = [list(r) for r in collectives]
    for r in rows:
        for w in r[5] if len(r) > 5 else ():
            clock.setdefault(int(w), 0.0)
    everyone = list(clock)
    for r in rows:
        _kind, op, n, payload, count = r[:5]
        group = [int(w) for w in r[5]] if len(r) > 5 else everyone
        if not group:
            continue
        t = int(count) * collective_seconds(str(op), int(n), int(payload), bandwidth, latency)
        done = max(clock[w] for w in group) + t
        for w in group:
            clock[w] = done
    return max(clock.values(), default=0.0)


def round_seconds(
    compute_s: Mapping[int, float],
    collectives: Iterable[Sequence[Any]],
    bandwidth: float,
    latency: float,
    speeds: Sequence[float] = (),
    behind: Iterable[Sequence[Any]] = (),
) -> float:
    """Simulated time of one round: each worker's compute (over its speed), then the counted collectives
    scheduled on the workers' links (:func:`schedule_seconds`), then what ran behind.

    ``behind``: ``[kind, op, n, payload, count, share]`` rows of collectives that ran behind a ``share``
    of the round's compute (ALGORITHM.md §13), each costing only what that compute did not hide. Those
    behind the whole round (``comm.overlap``: share 1) share it, one after another on the background lane:
    max(0, their time − the compute). Those behind part of it (streaming: τ of H inner steps) each have a
    window of their own: max(0, its time − share · the compute), every one of them."""
    start = {w: s / (speeds[w] if speeds else 1.0) for w, s in compute_s.items()}
    slowest = max(start.values(), default=0.0)
    whole = [r[:5] for r in behind if float(r[5]) >= 1.0]
    cost = max(0.0, comm_seconds(whole, bandwidth, latency) - slowest)
    for _kind, op, n, payload, count, share in (r for r in behind if float(r[5]) < 1.0):
        t = collective_seconds(str(op), int(n), int(payload), bandwidth, latency)
        cost += int(count) * max(0.0, t - float(share) * slowest)
    return schedule_seconds(start, collectives, bandwidth, latency) + cost


def bad_row(collectives: Any, behind: bool = False) -> Any:
    """The first row of a round event's ``collectives`` (``collectives_behind`` with ``behind``) that is
    not ``[kind, op, n, payload, count]`` followed by its workers (a list of ids; optional) or, behind,
    by its share (a number); None when every row is."""
    ops = ("all_reduce", "broadcast", "all_gather")

    def whole(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    for r in collectives if isinstance(collectives, list) else [collectives]:
        ok = isinstance(r, list) and len(r) in (5, 6) and isinstance(r[0], str) and r[1] in ops
        ok = ok and all(whole(x) for x in r[2:5])
        if ok and len(r) == 6:
            tail = r[5]
            ok = _number(tail) if behind else isinstance(tail, list) and all(whole(w) for w in tail)
        if not ok or (behind and len(r) != 6):
            return r
    return None


PER_TRAINER = ("delta", "grad", "probe")  # kinds a trainer sends among its own workers only (ALGORITHM.md §7)


def name_workers(collectives: Iterable[Sequence[Any]], trainers: Sequence[Sequence[int]]) -> list[list[Any]]:
    """Rows of a run recorded before rows named their workers, with the per-trainer kinds' workers named
    from the round's trainers (``trainers``: each trainer's workers): a row of ``count`` collectives among
    n workers is split evenly among the trainers of n workers, one row each. A row that cannot be split
    so (no trainer of n workers, a count that does not divide) and every other kind stay as they were:
    they hold every worker."""
    out: list[list[Any]] = []
    for row in collectives:
        r = list(row)
        if len(r) > 5 or r[0] not in PER_TRAINER:
            out.append(r)
            continue
        groups = [sorted(int(w) for w in g) for g in trainers if len(g) == int(r[2])]
        if not groups or int(r[4]) % len(groups):
            out.append(r)
            continue
        out += [[*r[:4], int(r[4]) // len(groups), g] for g in groups]
    return out
