"""Workers -> trainers (ALGORITHM.md §4): largest-remainder shares, every trainer at least one worker."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction


def shares(weights: Mapping[int, float], n_workers: int) -> dict[int, int]:
    """Apportion ``n_workers`` among trainers in proportion to ``weights`` (Hamilton's method).

    Every trainer gets at least one worker: a trainer left with none takes one from the trainer that is
    most over its quota among those holding two or more. Ties break by trainer id. Requires
    ``len(weights) <= n_workers``.
    """
    ids = sorted(weights)
    if not ids:
        return {}
    if len(ids) > n_workers:
        raise ValueError(f"{len(ids)} trainers cannot share {n_workers} workers")
    # Exact rational quotas: equal remainders must tie exactly, so that ties go by trainer id.
    exact = {t: Fraction(weights[t]) for t in ids}
    total = sum(exact.values(), Fraction(0))
    if total <= 0 or not all(math.isfinite(weights[t]) for t in ids):
        quota = {t: Fraction(n_workers, len(ids)) for t in ids}
    else:
        quota = {t: n_workers * exact[t] / total for t in ids}
    count = {t: math.floor(quota[t]) for t in ids}
    left = n_workers - sum(count.values())
    for t in sorted(ids, key=lambda t: (-(quota[t] - count[t]), t))[:left]:
        count[t] += 1
    for t in ids:
        if count[t] == 0:
            donor = max((d for d in ids if count[d] >= 2), key=lambda d: (count[d] - quota[d], -d))
            count[donor] -= 1
            count[t] = 1
    return count


def allocate(
    requests: Mapping[int, int],
    n_workers: int,
    current: Mapping[int, int] | None = None,
    mode: str = "requests",
) -> dict[int, int]:
    """Assign every worker (0..n_workers-1) to a trainer; returns {worker: trainer}.

    ``requests`` mode: shares proportional to each trainer's request b_t. ``demand`` (the reference):
    proportional to (workers it holds now) x b_t, which feeds back on itself.
    Workers stay where they are when their trainer keeps room for them (lowest worker ids first); the
    others fill the trainers short of their share in trainer-id order. Without ``current`` workers are
    dealt out in order: trainer 0 gets the first workers, and so on.
    """
    current = dict(current or {})
    weights: dict[int, float]
    if mode == "demand" and current:
        held = {t: sum(1 for w in current.values() if w == t) for t in requests}
        weights = {t: max(held[t], 1) * requests[t] for t in requests}
    elif mode in ("requests", "demand"):
        weights = {t: float(requests[t]) for t in requests}
    else:
        raise ValueError(f"unknown allocation mode {mode!r}")
    count = shares(weights, n_workers)
    out: dict[int, int] = {}
    room = dict(count)
    free: list[int] = []
    for w in range(n_workers):
        t = current.get(w)
        if t is not None and room.get(t, 0) > 0:
            out[w] = t
            room[t] -= 1
        else:
            free.append(w)
    for t in sorted(room):
        for _ in range(room[t]):
            out[free.pop(0)] = t
    return dict(sorted(out.items()))


def members(allocation: Mapping[int, int]) -> dict[int, list[int]]:
    """{trainer: sorted workers} from {worker: trainer}."""
    out: dict[int, list[int]] = {}
    for w, t in sorted(allocation.items()):
        out.setdefault(t, []).append(w)
    return out


def split(total: int, speeds: Mapping[int, float], fixed: float = 0.0) -> dict[int, int]:
    """``total`` examples per step shared by workers so that their steps take the same time (ALGORITHM.md
    §9.3): in proportion to their speeds when a step costs its rows alone, and, with ``fixed`` (a step's
    fixed cost in rows, α/β of a step-time profile, ALGORITHM.md §11), so that (fixed + m_w)/s_w is equal, a worker
    whose share would fall below one row held at one and the rest shared again. Largest remainder, every
    worker at least one, ties by worker id. Equal speeds give equal shares."""
    ids = sorted(speeds)
    if total < len(ids):
        raise ValueError(f"{total} examples cannot give each of {len(ids)} workers one")
    weights = {w: Fraction(speeds[w]).limit_denominator(10**6) for w in ids}
    c = Fraction(max(fixed, 0.0)).limit_denominator(10**6)
    quota: dict[int, Fraction] = {}
    free, rows = list(ids), Fraction(total)
    while free:
        s = sum((weights[w] for w in free), Fraction(0))
        scale = (rows + len(free) * c) / s if s > 0 else None
        q = {w: (weights[w] * scale - c) if scale is not None else rows / len(free) for w in free}
        low = [w for w in free if q[w] < 1]
        if not low or len(low) == len(free):
            quota.update(q)
            break
        for w in low:  # at one row each; the others share the rest
            quota[w] = Fraction(1)
            free.remove(w)
            rows -= 1
    out = {w: max(1, math.floor(quota[w])) for w in ids}
    while sum(out.values()) > total:  # the floor of one forced up: take from the most over its quota
        w = max((x for x in ids if out[x] > 1), key=lambda x: (out[x] - quota[x], -x))
        out[w] -= 1
    left = total - sum(out.values())
    for w in sorted(ids, key=lambda x: (-(quota[x] - out[x]), x))[:left]:
        out[w] += 1
    return out


def by_capacity(
    requests: Mapping[int, int], speeds: Mapping[int, float], current: Mapping[int, int] | None = None
) -> dict[int, int]:
    """Workers -> trainers so that each trainer's share of the total speed follows its request (ALGORITHM.md §9.3).

    Every trainer gets at least one worker. Workers are placed fastest first (ties by id), each to the
    trainer furthest below its target capacity Σ s · b_t / Σ b, preferring its current trainer when
    that trainer is as far below. With equal speeds it gives the same counts as :func:`allocate`'s shares."""
    ids = sorted(requests)
    workers = sorted(speeds, key=lambda w: (-speeds[w], w))
    if len(ids) > len(workers):
        raise ValueError(f"{len(ids)} trainers cannot share {len(workers)} workers")
    total_speed = sum(speeds.values())
    total_b = sum(requests.values())
    target = {t: total_speed * requests[t] / total_b for t in ids}
    if len(set(speeds.values())) <= 1:  # equal speeds: the counts of the request shares
        return allocate(requests, len(workers), current)
    got = dict.fromkeys(ids, 0.0)
    held = dict.fromkeys(ids, 0)
    out: dict[int, int] = {}
    current = dict(current or {})
    for i, w in enumerate(workers):
        left = len(workers) - i
        empty = [t for t in ids if held[t] == 0]
        pool = empty if len(empty) >= left else ids  # the last workers go where none is yet
        best = max(pool, key=lambda t: (target[t] - got[t], current.get(w) == t, -t))
        out[w] = best
        got[best] += speeds[w]
        held[best] += 1
    return dict(sorted(out.items()))
