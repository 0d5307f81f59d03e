"""Membership changes (ALGORITHM.md §9.2): a run continues on a different number of workers.

Pure decisions on the replicated state: which trainers merge when fewer workers than trainers are left,
how the workers are shared among the trainers alive, and what each trainer's request becomes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from adloco.library.algorithms import allocation, merging


@dataclass(frozen=True)
class MergeStep:
    merged: list[int]
    survivor: int
    weights: dict[int, float]
    request: int


@dataclass(frozen=True)
class Resize:
    """What a change from the old to the new number of workers does."""

    merges: list[MergeStep] = field(default_factory=list)
    requests: dict[int, int] = field(default_factory=dict)  # after merges and the batch policy
    allocation: dict[int, int] = field(default_factory=dict)  # worker -> trainer, new workers 0..n-1
    kept: list[int] = field(default_factory=list)  # workers that serve the same trainer as before
    left: list[int] = field(default_factory=list)  # worker ids gone
    joined: list[int] = field(default_factory=list)  # worker ids new


def resize(
    requests: Mapping[int, int],
    old_allocation: Mapping[int, int],
    n_workers: int,
    *,
    policy: str = "smallest",
    size: int = 2,
    survivor_batch: str = "max",
    mode: str = "requests",
    batch: str = "per_trainer",
    cap: int | None = None,
) -> Resize:
    """Trainers alive with their requests, the old worker -> trainer map, and the new number of workers.

    1. While more trainers than workers are alive, merge |S| of them by ``policy`` (``none`` merges the
       smallest, since every trainer needs a worker), weights b_j / Σ b.
    2. Share the n workers by requests (largest remainder, ALGORITHM.md §4); workers 0..n−1 keep their trainer
       when it keeps room for them.
    3. ``per_trainer``: b'_t = min(cap, ⌈M_t·b_t / M'_t⌉), each trainer's examples per step stay (at least)
       what they were; ``per_worker``: b'_t = b_t.
    """
    if n_workers < 1:
        raise ValueError(f"workers: {n_workers} must be >= 1")
    reqs = dict(sorted(requests.items()))
    alloc = dict(old_allocation)
    merges: list[MergeStep] = []
    while len(reqs) > n_workers:
        S = merging.select(
            reqs, "smallest" if policy == "none" else policy, min(size, len(reqs) - n_workers + 1)
        )
        if len(S) < 2:
            S = merging.select(reqs, "smallest", 2)
        w = merging.weights(reqs, S)
        keep = merging.survivor(S)
        b = merging.merged_request(reqs, S, survivor_batch, keep)
        merges.append(MergeStep(S, keep, w, b))
        for t in S:
            if t != keep:
                del reqs[t]
        reqs[keep] = b
        alloc = {x: (keep if t in S else t) for x, t in alloc.items()}
    before = allocation.members(alloc)
    current = {x: t for x, t in alloc.items() if x < n_workers}
    new = allocation.allocate(reqs, n_workers, current, mode)
    after = allocation.members(new)
    if batch == "per_trainer":
        out = {}
        for t, b in reqs.items():
            m_old, m_new = len(before.get(t, [])), len(after[t])
            grown = math.ceil(m_old * b / m_new) if m_old else b
            out[t] = max(1, min(cap, grown) if cap is not None else grown)
        reqs = out
    elif batch != "per_worker":
        raise ValueError(f"batch: {batch!r} is not one of per_trainer | per_worker")
    old_ids = sorted(old_allocation)
    return Resize(
        merges=merges,
        requests=dict(sorted(reqs.items())),
        allocation=new,
        kept=[x for x in sorted(new) if old_allocation.get(x) == new[x]],
        left=[x for x in old_ids if x >= n_workers],
        joined=[x for x in range(n_workers) if x not in old_allocation],
    )
