"""Workers -> trainers (spec §4): largest-remainder shares, every trainer at least one worker."""

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
