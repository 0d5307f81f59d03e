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
after another. A collective run behind the round's compute (``sync.overlap``) costs max(0, its time −
that compute) (ALGORITHM.md §13).

A :class:`Link` is the same model handed to a communicator: with ``network.emulate`` every counted
collective is held back until its wall time is what the model says (:attr:`adloco.library.comm.Comm.link`).

A :class:`Network` is the model with links of their own: an upload slower than the download, a link per
worker (a factor on its bandwidth), and sites, each with fast links inside and one slower link to the
others, as cross-datacenter runs are. A collective within one site is the ring above on its slowest
link; one across sites is priced as the hierarchical collective a cross-site run uses (inside each site,
then between sites over their links, then inside again: :meth:`Network.seconds_among`). With one site,
symmetric links and no factors it is :func:`collective_seconds` exactly. Every function below takes one
(``net``) in place of a bandwidth and a latency, and so do the engine (``network.*``) and ``adloco
simulate``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple


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

    def seconds_among(self, op: str, workers: Sequence[int], payload: int) -> float:
        """A collective among ``workers`` (every worker's link alike: only their number counts)."""
        return self.seconds(op, len(workers), payload)


@dataclass(frozen=True)
class Network:
    """Links of their own (ALGORITHM.md §7): every worker's link downloads at ``bandwidth`` and uploads at
    ``upload`` (None: as fast) bytes per second, each times its factor in ``link_speeds`` (worker w's is
    ``link_speeds[w mod len]``; empty: 1), with ``latency`` seconds a hop; ``sites``: how many workers each
    site holds, in worker order (empty: one site), each site reaching the others over a link of
    ``site_bandwidth`` bytes per second (both ways) and ``site_latency`` seconds a hop. A worker beyond the
    sites' total (one that joined) is in the site of its id modulo that total."""

    bandwidth: float
    latency: float
    upload: float | None = None
    sites: tuple[int, ...] = ()
    site_bandwidth: float | None = None
    site_latency: float = 0.0
    link_speeds: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        Link(self.bandwidth, self.latency)  # the same checks, the same words
        if self.upload is not None:
            Link(self.upload, 0.0)
        if self.site_bandwidth is not None:
            Link(self.site_bandwidth, self.site_latency)
        if not all(isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in self.sites):
            raise ValueError(f"network: sites {list(self.sites)!r} must be whole numbers of workers >= 1")
        if len(self.sites) > 1 and self.site_bandwidth is None:
            raise ValueError("network: several sites need the bandwidth of the link between them")
        if not all(_number(f) and 0 < f <= 1 for f in self.link_speeds):
            raise ValueError(f"network: link speeds {list(self.link_speeds)!r} must be numbers in (0, 1]")
        bounds, total = [], 0
        for m in self.sites:
            total += m
            bounds.append(total)
        object.__setattr__(self, "_bounds", tuple(bounds))

    def site(self, worker: int) -> int:
        """The site of ``worker`` (0 with one site)."""
        bounds: tuple[int, ...] = self._bounds  # type: ignore[attr-defined]
        if len(bounds) <= 1:
            return 0
        return bisect.bisect_right(bounds, worker % bounds[-1])

    def link(self, worker: int) -> float:
        """What ``worker``'s own link carries each way: its slower direction, times its factor."""
        down = self.bandwidth
        slower = down if self.upload is None else min(down, self.upload)
        if self.link_speeds:
            slower *= self.link_speeds[worker % len(self.link_speeds)]
        return slower

    def seconds_among(self, op: str, workers: Sequence[int], payload: int) -> float:
        """A collective of ``payload`` bytes from each of ``workers``.

        Within one site, the ring of :func:`collective_seconds` on the group's slowest link (a ring moves as
        much up as down, so a worker's slower direction bounds it). Across s sites, with m the most workers
        of the group in one site and β_s, α_s the links between sites: an all-reduce reduces inside each
        site, all-reduces between sites (each site's link carries 2(s−1)/s·B, its m workers' shards together)
        and gathers inside again: 2(m−1)/m·B/β + 2(m−1)·α + 2(s−1)/s·B/β_s + 2(s−1)·α_s; an all-gather
        gathers inside the site, and every site takes in the other sites' pieces, (n − m_min)·B over the
        slower of its link and a worker's: (m−1)·B/β + (m−1)·α + (n − m_min)·B/min(β_s, β) + (s−1)·α_s; a
        broadcast crosses one site link: B/min(β_s, β) + ⌈log₂ s⌉·α_s + ⌈log₂ m⌉·α."""
        n = len(workers)
        if n <= 1:
            return 0.0
        beta = min(self.link(w) for w in workers)
        if len(self.sites) <= 1:
            return collective_seconds(op, n, payload, beta, self.latency)
        per_site: dict[int, int] = {}
        for w in workers:
            per_site[self.site(w)] = per_site.get(self.site(w), 0) + 1
        s = len(per_site)
        if s == 1:
            return collective_seconds(op, n, payload, beta, self.latency)
        assert self.site_bandwidth is not None
        m, least = max(per_site.values()), min(per_site.values())
        wan, alpha, alpha_s = self.site_bandwidth, self.latency, self.site_latency
        if op == "all_reduce":
            inside = 2 * (m - 1) / m * payload / beta + 2 * (m - 1) * alpha
            return inside + 2 * (s - 1) / s * payload / wan + 2 * (s - 1) * alpha_s
        if op == "all_gather":
            inside = (m - 1) * payload / beta + (m - 1) * alpha
            return inside + (n - least) * payload / min(wan, beta) + (s - 1) * alpha_s
        if op == "broadcast":
            hops = math.ceil(math.log2(s)) * alpha_s + math.ceil(math.log2(m)) * alpha
            return payload / min(wan, beta) + hops
        raise ValueError(f"unknown collective {op!r}")


Model = Link | Network  # what prices a collective among named workers


def network(
    bandwidth: float,
    latency: float,
    upload: float | None = None,
    sites: Sequence[int] = (),
    site_bandwidth: float | None = None,
    site_latency: float = 0.0,
    link_speeds: Sequence[float] = (),
) -> Model:
    """The model of these links: a :class:`Link` when every link is alike (one site, symmetric, no
    factors), else a :class:`Network`."""
    if upload is None and len(sites) <= 1 and not link_speeds:
        return Link(bandwidth, latency)
    return Network(bandwidth, latency, upload, tuple(sites), site_bandwidth, site_latency, tuple(link_speeds))


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def comm_seconds(
    collectives: Iterable[Sequence[Any]], bandwidth: float, latency: float, net: Model | None = None
) -> float:
    """Total cost of ``[kind, op, n, payload, count]`` rows (as logged in a round event; a sixth element,
    the workers, is ignored but by ``net``, which prices them among those workers): every collective one
    after another."""
    total = 0.0
    for row in collectives:
        _kind, op, n, payload, count = row[:5]
        total += int(count) * _cost(row, bandwidth, latency, net)
    return total


def _cost(row: Sequence[Any], bandwidth: float, latency: float, net: Model | None) -> float:
    """One collective of a row: on ``net`` among its workers (the first n when it names none), else on the
    uniform link."""
    _kind, op, n, payload = row[:4]
    if net is None:
        return collective_seconds(str(op), int(n), int(payload), bandwidth, latency)
    workers = [int(w) for w in row[5]] if len(row) > 5 and isinstance(row[5], list) else range(int(n))
    return net.seconds_among(str(op), workers, int(payload))


def schedule(
    start: Mapping[int, float],
    collectives: Iterable[Sequence[Any]],
    bandwidth: float,
    latency: float,
    net: Model | None = None,
) -> dict[int, float]:
    """When each worker is done: each worker free at ``start[w]``, then the ``[kind, op, n, payload, count,
    workers]`` rows in order, each starting when the last of its workers is free and holding them ``count``
    times its cost. A row without its ``workers`` holds every worker of ``start`` and every worker any row
    named."""
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
        t = int(count) * _cost([_kind, op, n, payload, count, group], bandwidth, latency, net)
        done = max(clock[w] for w in group) + t
        for w in group:
            clock[w] = done
    return clock


class RoundTime(NamedTuple):
    """A round's simulated time in parts (:func:`round_time`)."""

    clock: dict[int, float]  # when each worker is done with its compute and the collectives in its way
    cost: float  # what ran behind cost the round beyond the slowest clock

    @property
    def seconds(self) -> float:
        """The round's simulated time: the slowest worker's clock and what ran behind beyond it."""
        return max(self.clock.values(), default=0.0) + self.cost


def round_time(
    compute_s: Mapping[int, float],
    collectives: Iterable[Sequence[Any]],
    bandwidth: float,
    latency: float,
    speeds: Sequence[float] = (),
    behind: Iterable[Sequence[Any]] = (),
    net: Model | None = None,
) -> RoundTime:
    """Simulated time of one round (:attr:`RoundTime.seconds`): each worker's compute (over its speed),
    then the counted collectives scheduled on the workers' links (:func:`schedule`), then what ran
    behind. ``net``: the links (:class:`Network`) in place of one ``bandwidth`` and ``latency`` for all.

    ``behind``: ``[kind, op, n, payload, count, share]`` rows of collectives that ran behind a ``share``
    of the round's compute (ALGORITHM.md §13), each costing only what that compute did not hide. Those
    behind the whole round (``sync.overlap``: share 1) share it, one after another on the background lane:
    max(0, their time − the compute). Those behind part of it (streaming: τ of H inner steps) each have a
    window of their own: max(0, its time − share · the compute), every one of them. In parts: ``clock``,
    when each worker is done with its compute and the collectives in its way (:func:`schedule`), and
    ``cost``, what ran behind cost the round beyond that."""
    start = {w: s / (speeds[w] if speeds else 1.0) for w, s in compute_s.items()}
    slowest = max(start.values(), default=0.0)
    behind = [list(r) for r in behind]
    whole = [r[:5] for r in behind if float(r[5]) >= 1.0]
    cost = max(0.0, comm_seconds(whole, bandwidth, latency, net) - slowest)
    for r in (r for r in behind if float(r[5]) < 1.0):
        t = _cost(r[:5], bandwidth, latency, net)
        cost += int(r[4]) * max(0.0, t - float(r[5]) * slowest)
    return RoundTime(schedule(start, collectives, bandwidth, latency, net), cost)


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
