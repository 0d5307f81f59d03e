"""A fake multi-process backend for tests: one coordinator per thread, each hosting some workers.

Every collective is called by every "process" in the same order (the coordinator guarantees it); the
threads exchange what they hold through a barrier, and each reduces over the processes that host a
worker of the group, as torch.distributed process groups would.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from adloco.engine.comm import Comm


class Hub:
    def __init__(self, world: int) -> None:
        self.world = world
        self.slots: list[Any] = [None] * world
        self.barrier = threading.Barrier(world, timeout=60)


class ThreadComm(Comm):
    def __init__(self, hub: Hub, rank: int, n_workers: int, owner: Mapping[int, int]) -> None:
        super().__init__(n_workers, [w for w, r in sorted(owner.items()) if r == rank], rank, hub.world)
        self.hub, self._owner = hub, dict(owner)

    def owner(self, worker: int) -> int:
        return self._owner[worker]

    def _exchange(self, value: Any) -> list[Any]:
        self.hub.slots[self.rank] = value
        self.hub.barrier.wait()
        out = list(self.hub.slots)
        self.hub.barrier.wait()  # everyone has read before the next exchange overwrites
        return out

    def _members(self, workers: Sequence[int]) -> list[int]:
        return sorted({self._owner[w] for w in workers})

    def _all_reduce(self, tensor: torch.Tensor, workers: Sequence[int]) -> None:
        deposits = self._exchange(tensor.clone())
        members = self._members(workers)
        if self.rank in members:
            total = deposits[members[0]].clone()
            for r in members[1:]:
                total += deposits[r]
            tensor.copy_(total)

    def _broadcast(self, tensor: torch.Tensor, src: int, workers: Sequence[int]) -> None:
        deposits = self._exchange(tensor.clone())
        if self.rank in self._members(workers):
            tensor.copy_(deposits[self._owner[src]])

    def _all_gather_rows(self, rows: Mapping[int, Sequence[float]], width: int) -> dict[int, list[float]]:
        merged: dict[int, list[float]] = {}
        for d in self._exchange({w: list(v) for w, v in rows.items()}):
            merged.update(d)
        return dict(sorted(merged.items()))


def run_threaded(make_coordinator, owner: Mapping[int, int], rounds: int) -> list[Any]:  # type: ignore[no-untyped-def]
    """Build one coordinator per rank (``make_coordinator(comm)``) and run ``rounds`` rounds in threads.

    Returns the coordinators, rank order; re-raises the first error of any thread.
    """
    world = max(owner.values()) + 1
    hub = Hub(world)
    # Built one after another: model initialization draws from torch's process-global RNG, which
    # threads would share (separate processes do not). Construction runs no collective.
    coords = [make_coordinator(ThreadComm(hub, rank, len(owner), owner)) for rank in range(world)]
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            for _ in range(rounds):
                coords[rank].run_round()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)
            hub.barrier.abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return coords
