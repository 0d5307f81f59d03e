"""Simulated wall time (ALGORITHM.md §7): measured compute plus each collective's cost on a modelled network.

A collective among n workers of a payload of B bytes each, on links of bandwidth β (bytes/s) and
latency α (s):
  all_reduce (ring):      2(n−1)/n · B/β + 2(n−1)·α
  broadcast (pipelined):  B/β + ⌈log2 n⌉·α
  all_gather (ring):      (n−1) · B/β + (n−1)·α
A round's simulated time is the slowest worker's compute time (divided by its speed) plus the cost of
every counted collective of the round, one after another as the engine issues them (collectives of
disjoint trainers could overlap: the model is conservative there).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
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


def comm_seconds(collectives: Iterable[Sequence[Any]], bandwidth: float, latency: float) -> float:
    """Total cost of ``[kind, op, n, payload, count]`` rows (as logged in a round event)."""
    total = 0.0
    for _kind, op, n, payload, count in collectives:
        total += int(count) * collective_seconds(str(op), int(n), int(payload), bandwidth, latency)
    return total


def round_seconds(
    compute_s: Mapping[int, float],
    collectives: Iterable[Sequence[Any]],
    bandwidth: float,
    latency: float,
    speeds: Sequence[float] = (),
) -> float:
    """Simulated time of one round: the slowest worker's compute (over its speed) plus communication."""
    slowest = max((s / (speeds[w] if speeds else 1.0) for w, s in compute_s.items()), default=0.0)
    return slowest + comm_seconds(collectives, bandwidth, latency)
