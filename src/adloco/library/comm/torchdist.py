"""torch.distributed: one process per worker, or per device hosting ``workers_per_process`` workers.

Process ``r`` hosts workers ``r·wpp .. r·wpp + wpp − 1`` and reduces them locally before the collective,
so the in-process backend is the one-process case of the same round. gloo on CPU tensors, NCCL on CUDA
(NCCL refuses two ranks on one device; gloo also moves CUDA tensors, through host memory).

Groups: a collective among some workers runs in the process group of the ranks hosting them. Groups
are created on first use and cached by their rank set. Every rank issues every collective in the same
order (decisions are replicated), so every rank creates the same groups in the same order, as
``new_group`` requires, with no separate rebuild step after a merge or a reallocation.

Sharded workers (``mesh``, ALGORITHM.md §12): a 2-D device mesh (worker, shard) of N ranks, k per worker,
worker w on ranks w·k .. w·k + k − 1, each holding the j-th shard of its replica. Every collective over
workers runs between the ranks of this rank's shard index j (each moves its P/k values): the rank that
"hosts" worker w, seen from here, is w·k + j. A group over some workers is created k times, once per
shard index, by every rank in the same order, and each rank keeps its own. The round's accounting is
summed over the worker's k ranks when it is drained, so bytes are counted per worker, as unsharded.
"""

from __future__ import annotations

import atexit
import dataclasses
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

from adloco.library.comm.base import Comm, CommFailure, CommRecord, Shards
from adloco.netmodel import Link

if TYPE_CHECKING:
    from adloco.library.comm.compressed import GroupOps

T = TypeVar("T")
_EXIT_GUARD: list[bool] = []


def _let_collectives_settle() -> None:
    """Release the GIL for a moment before the interpreter finalizes.

    A gloo worker thread drops its last reference to a finished collective's tensors after the caller's
    ``wait()`` has returned, and dropping it takes the GIL. Once ``torch._dynamo`` has been imported (the
    first optimizer step does it), the process group outlives ``destroy_process_group()`` and its threads
    live until exit; a thread that asks for the GIL while the interpreter finalizes is ended by Python
    inside a C++ frame, and the process aborts ("terminate called without an active exception") after a
    run that succeeded. Running before finalization, this gives those threads the moment they need.
    """
    time.sleep(0.05)


def _guard_exit() -> None:
    if not _EXIT_GUARD:
        _EXIT_GUARD.append(True)
        atexit.register(_let_collectives_settle)


class TorchDistComm(Comm):
    """The default process group (``torch.distributed.init_process_group`` must have run).

    ``device``: where the tensors it moves live (default: this rank's CUDA device under NCCL, else CPU).
    ``link``: hold every counted collective back to its time on this modelled link, ``(bandwidth,
    latency)`` (:attr:`adloco.library.comm.Comm.link`).
    """

    def __init__(
        self,
        workers_per_process: int = 1,
        device: torch.device | str | None = None,
        *,
        link: Link | tuple[float, float] | None = None,
        mesh: Any = None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "comm: torch.distributed is not initialized; call torch.distributed.init_process_group() "
                "first (torchrun sets the environment), or use InProcessComm for workers in one process"
            )
        if workers_per_process < 1:
            raise ValueError(f"workers_per_process: {workers_per_process} must be >= 1")
        rank, world = dist.get_rank(), dist.get_world_size()
        _guard_exit()
        wpp = workers_per_process
        k = 1 if mesh is None else int(mesh.size(1))
        if mesh is not None:
            if mesh.ndim != 2 or mesh.mesh_dim_names != ("worker", "shard") or wpp != 1:
                raise ValueError("mesh: a 2-D device mesh ('worker', 'shard') with one worker per process")
            if mesh.mesh.flatten().tolist() != list(range(world)):
                raise ValueError(
                    "mesh: worker w must be ranks w·k .. w·k + k - 1 (init_device_mesh's layout)"
                )
        if mesh is None:
            super().__init__(world * wpp, range(rank * wpp, (rank + 1) * wpp), rank, world, link=link)
        else:
            super().__init__(world // k, [rank // k], rank, world, link=link)
            self.shards = Shards(k, rank % k, mesh.get_group("shard"))
        self.wpp, self.k, self.mesh = wpp, k, mesh
        if device is None:
            nccl = dist.get_backend() == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        self.device = torch.device(device)
        self.one_device = world == 1
        self._groups: dict[tuple[int, ...], Any] = {}
        self._lane_groups: dict[tuple[int, ...], Any] = {}  # the background lane's (sync.overlap)
        # the ranks of this shard index, one per worker, and their group (the world's when unsharded)
        self._everyone = tuple(sorted({self.owner(w) for w in range(self.n_workers)}))
        self._world_group = None if mesh is None else mesh.get_group("worker")

    def owner(self, worker: int) -> int:
        """The rank of the process hosting ``worker`` (sharded: its rank of this rank's shard index)."""
        if self.k > 1:
            return worker * self.k + self.rank % self.k
        return worker // self.wpp

    def workers_of(self, rank: int) -> list[int]:
        if self.k > 1:
            return [rank // self.k]
        return super().workers_of(rank)

    def _ranks(self, workers: Sequence[int]) -> tuple[int, ...]:
        return tuple(sorted({self.owner(w) for w in workers}))

    def _group(self, ranks: tuple[int, ...]) -> Any:
        if self._behind:  # the background lane's own groups, made on the main thread (_prepare_lane)
            return self._lane_groups[ranks]
        if ranks == self._everyone:
            return self._world_group  # None: the default (world) group
        g = self._groups.get(ranks)
        if g is None:  # every rank gets here in the same order: see the module docstring
            g = self._groups[ranks] = self._new_groups(ranks)
        return g

    def _new_groups(self, ranks: tuple[int, ...]) -> Any:
        """A new group of ``ranks``, made by every rank (sharded: once per shard index); this rank's."""
        g, mine = None, self.rank % self.k
        for j in range(self.k):  # sharded: the same workers' group for every shard index
            ranks_j = [r - mine + j for r in ranks]
            made = self._guard("new_group", lambda r=ranks_j: dist.new_group(r))  # type: ignore[misc]
            if j == mine:
                g = made
        return g

    def _prepare_lane(self, workers: Sequence[int]) -> None:
        """The lane's collectives run in groups of their own (a group's collectives must be issued in one
        order by every member; the main thread's and the lane's would interleave), made here, on the main
        thread, on every rank in the same order."""
        ranks = self._ranks(workers)
        if len(ranks) >= 2 and ranks not in self._lane_groups:
            self._lane_groups[ranks] = self._new_groups(ranks)

    def drain(self) -> list[CommRecord]:
        """Records since the last drain; sharded, each vector collective's bytes summed over the worker's
        ranks (every rank of a worker made the same collectives, each on its shard), so a worker's P values
        count once."""
        out = super().drain()
        if self.k > 1 and out:
            sizes = torch.tensor([[r.payload, r.wire] for r in out], dtype=torch.float64)
            self.shards.sum_(sizes)
            out = [  # a gather of scalars is the whole worker's already: each rank sent the same row
                r if r.op == "all_gather" else dataclasses.replace(r, payload=int(p), wire=int(w))
                for r, (p, w) in zip(out, sizes.tolist(), strict=True)
            ]
        return out

    def _guard(self, op: str, fn: Callable[[], T]) -> T:
        """Run a torch.distributed call; any failure becomes a CommFailure (the caller adds the kind)."""
        try:
            return fn()
        except Exception as exc:  # gloo and NCCL raise RuntimeError subclasses with their own text
            raise CommFailure(op, "", first_sentence(str(exc)) or type(exc).__name__) from exc

    def _all_reduce(self, tensor: torch.Tensor, workers: Sequence[int]) -> None:
        ranks = self._ranks(workers)
        if len(ranks) < 2:
            return
        group = self._group(ranks)
        if self.rank in ranks:
            self._guard("all_reduce", lambda: dist.all_reduce(tensor, group=group))

    def _broadcast(self, tensor: torch.Tensor, src: int, workers: Sequence[int]) -> None:
        ranks = self._ranks(workers)
        if len(ranks) < 2:
            return
        group = self._group(ranks)
        if self.rank in ranks:
            self._guard("broadcast", lambda: dist.broadcast(tensor, src=self.owner(src), group=group))

    def _all_gather_rows(self, rows: Mapping[int, Sequence[float]], width: int) -> dict[int, list[float]]:
        # Each worker's row is written by exactly one process and is zero elsewhere: a SUM is exact.
        buf = torch.zeros(self.n_workers, width, dtype=torch.float64)
        for w, row in rows.items():
            buf[w] = torch.tensor(list(row), dtype=torch.float64)
        buf = buf.to(self.device)
        group = self._world_group
        self._guard("all_gather", lambda: dist.all_reduce(buf, group=group))
        return {w: [float(x) for x in r] for w, r in enumerate(buf.cpu().tolist())}

    def _all_gather_bytes(self, data: bytes) -> list[bytes]:
        size = torch.zeros(self.world, dtype=torch.int64, device=self.device)
        size[self.rank] = len(data)
        self._guard("all_gather", lambda: dist.all_reduce(size))
        longest = int(size.max())
        mine = torch.zeros(longest, dtype=torch.uint8, device=self.device)
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else mine[:0]
        parts = [torch.empty_like(mine) for _ in range(self.world)]
        self._guard("all_gather", lambda: dist.all_gather(parts, mine))
        return [bytes(p[: int(n)].cpu().tolist()) for p, n in zip(parts, size.tolist(), strict=True)]

    def _participants(self, workers: list[int]) -> GroupOps:
        from adloco.library.comm.compressed import Bystander, InProcessGroup, TorchDistParticipants

        ranks = self._ranks(workers)
        if len(ranks) < 2:  # every participant on one process: the same arithmetic, nothing moves
            return InProcessGroup(len(workers)) if self.rank in ranks else Bystander(len(workers))
        group = self._group(ranks)  # new_group is collective over the world: every rank makes it, in order
        if self.rank not in ranks:
            return Bystander(len(workers))
        # every worker of the group is a participant, in worker order, on the process hosting it
        owners = [ranks.index(self.owner(w)) for w in workers]
        return TorchDistParticipants(group, owners, ranks.index(self.rank))

    def _guarded(self, op: str, fn: Callable[[], T]) -> T:
        return self._guard(op, fn)

    def spread(self, tensor: torch.Tensor) -> None:
        root = self.root
        self._guard("broadcast", lambda: dist.broadcast(tensor, src=root))

    def fetch(self, tensor: torch.Tensor, src: int) -> None:
        s = self.owner(src)
        root = self.root - self.root % self.k + self.rank % self.k  # sharded: the root worker's, shard j
        if s == root:
            return
        # gloo's point-to-point transport sends host memory only: CUDA tensors go through a CPU copy
        host = tensor.cpu() if tensor.is_cuda and dist.get_backend() == "gloo" else tensor
        if self.rank == s:
            self._guard("send", lambda: dist.send(host, dst=root))
        elif self.rank == root:
            self._guard("recv", lambda: dist.recv(host, src=s))
            if host is not tensor:
                tensor.copy_(host)


def first_sentence(text: str) -> str:
    """gloo/NCCL error text without source locations, cut to its first sentence."""
    text = re.sub(
        r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text.strip().splitlines()[0] if text.strip() else ""
    )
    return re.split(r"(?<=[a-z0-9\]])\. ", text, maxsplit=1)[0][:200]
