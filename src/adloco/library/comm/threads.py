"""Workers in threads of one process: each thread is a "process" of the protocol with its own algorithm
object, and collectives meet at a barrier.

For loops adloco cannot drive step by step (a Hugging Face ``Trainer`` owns its loop: run one per
thread), and for tests of the multi-process logic without processes. Every thread must call every
collective in the same order, as processes would.

    hub = Hub(2)
    comms = [ThreadComm(hub, rank) for rank in range(2)]   # one worker per thread
    # thread r: DiLoCo(model_r, opt_r, inner_steps=H, comm=comms[r]) ...
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from adloco.library.comm.base import Comm
from adloco.netmodel import Link


class Hub:
    """The meeting point of ``world`` threads (``timeout`` seconds at most per collective)."""

    def __init__(self, world: int, timeout: float = 600.0, *, _lane: bool = True) -> None:
        if world < 1:
            raise ValueError(f"world: {world} must be >= 1")
        self.world = world
        self.slots: list[Any] = [None] * world
        self.barrier = threading.Barrier(world, timeout=timeout)
        # where the threads' background lanes meet (sync.overlap): apart from the main exchanges
        self.lane = Hub(world, timeout, _lane=False) if _lane else None

    def abort(self) -> None:
        """Break the barrier: every thread waiting in a collective gets an error instead of waiting."""
        self.barrier.abort()
        if self.lane is not None:
            self.lane.abort()


class ThreadComm(Comm):
    """Thread ``rank`` of ``hub``. ``owner`` maps every worker to the thread hosting it (default: worker
    w in thread w, one worker each). ``link``: hold every counted collective back to its time on this
    modelled link, ``(bandwidth, latency)`` (:attr:`adloco.library.comm.Comm.link`): each thread hosting one of
    its workers sleeps once, however many of them it hosts."""

    def __init__(
        self,
        hub: Hub,
        rank: int,
        owner: Mapping[int, int] | None = None,
        *,
        link: Link | tuple[float, float] | None = None,
    ) -> None:
        owner = dict(owner) if owner is not None else {w: w for w in range(hub.world)}
        if not 0 <= rank < hub.world:
            raise ValueError(f"rank: {rank} is not in [0, {hub.world})")
        if sorted(set(owner.values())) != list(range(hub.world)):
            raise ValueError(f"owner: every thread 0..{hub.world - 1} must host at least one worker")
        super().__init__(
            len(owner), [w for w, r in sorted(owner.items()) if r == rank], rank, hub.world, link=link
        )
        self.hub, self._owner = hub, owner

    def owner(self, worker: int) -> int:
        return self._owner[worker]

    def _exchange(self, value: Any) -> list[Any]:
        hub = self.hub.lane if self._behind else self.hub
        assert hub is not None
        hub.slots[self.rank] = value
        hub.barrier.wait()
        out = list(hub.slots)
        hub.barrier.wait()  # everyone has read before the next exchange overwrites
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
        for d in self._exchange({w: [float(x) for x in v] for w, v in rows.items()}):
            merged.update(d)
        return dict(sorted(merged.items()))

    def _all_gather_bytes(self, data: bytes) -> list[bytes]:
        return list(self._exchange(data))

    def fetch(self, tensor: torch.Tensor, src: int) -> None:
        deposits = self._exchange(tensor.clone())
        if self.rank == self.root:
            tensor.copy_(deposits[self._owner[src]])

    def _participants(self, workers: list[int]) -> ThreadParticipants:
        return ThreadParticipants(self, workers)


class ThreadParticipants:
    """The compressed all-reduce's collectives among threads (:class:`adloco.library.comm.compressed.GroupOps`):
    every thread meets at every exchange, hosting a participant or not, deposits what its own
    participants send, and takes what was sent to them; each thread encodes, sums and decodes for its own
    participants only (and keeps their error feedback), as processes do."""

    def __init__(self, comm: ThreadComm, workers: list[int]) -> None:
        self.comm = comm
        self.n = len(workers)
        self.local: Sequence[int] = [i for i, w in enumerate(workers) if w in comm.local_workers]

    def exchange(
        self, send: Sequence[Sequence[torch.Tensor]], sizes: Sequence[int]
    ) -> list[list[torch.Tensor]]:
        every: dict[int, Sequence[torch.Tensor]] = {}
        for d in self.comm._exchange(dict(zip(self.local, send, strict=True))):
            every.update(d)
        return [[every[m][r] for m in range(self.n)] for r in self.local]

    def all_gather(self, mine: Sequence[torch.Tensor], sizes: Sequence[int]) -> list[torch.Tensor]:
        every: dict[int, torch.Tensor] = {}
        for d in self.comm._exchange(dict(zip(self.local, mine, strict=True))):
            every.update(d)
        return [every[r] for r in range(self.n)]

    def all_reduce(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError("float32 travels by ThreadComm's own all-reduce")
