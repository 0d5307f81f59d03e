"""``adloco train`` under torch.distributed: joining the process group, liveness, start-up order.

Launched by ``torchrun`` (one machine or many; c10d rendezvous) or by ``adloco train --nproc N``; the
collectives themselves are :class:`adloco.library.comm.torchdist.TorchDistComm`.

Failure: collectives time out after ``runtime.timeout``. A heartbeat thread bumps a counter in the
rendezvous store every second; when a collective fails, the survivors read the counters twice and name
the ranks whose counter stood still (dead or hung), with the round, in one line, and exit non-zero.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from adloco.library.comm.base import CommFailure
from adloco.library.comm.torchdist import TorchDistComm, first_sentence
from adloco.engine.dist.env import LOOPBACK_ENV, STORE_ENV
from adloco.config.checks import uses_cuda
from adloco.errors import PeerFailed, UserError

T = TypeVar("T")
_STARTUP_KEY = "adloco/startup"


# --------------------------------------------------------------------------------------------------
# Liveness
# --------------------------------------------------------------------------------------------------


def _store() -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - older or exotic setups: no heartbeats, still no hang
        return None


class Heartbeat:
    """A daemon thread bumping ``adloco/hb/<rank>`` in the rendezvous store every ``interval`` seconds."""

    def __init__(self, rank: int, interval: float = 1.0) -> None:
        self.rank, self.interval = rank, interval
        self.store = _store()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adloco-heartbeat", daemon=True)
        if self.store is not None:
            self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                self.store.set(f"adloco/hb/{self.rank}", str(n))
            except Exception:  # noqa: BLE001 - the store went away: nothing left to report to
                return
            n += 1
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()

    def silent_ranks(self, world: int) -> list[int] | None:
        """Ranks whose heartbeat did not move over 2.5 intervals (None: the store is unreachable)."""
        if self.store is None:
            return None

        def read() -> list[int]:
            out = []
            for r in range(world):
                key = f"adloco/hb/{r}"
                out.append(int(self.store.get(key)) if self.store.check([key]) else -1)
            return out

        try:
            before = read()
            time.sleep(2.5 * self.interval)
            after = read()
        except Exception:  # noqa: BLE001
            return None
        return [r for r in range(world) if r != self.rank and after[r] <= before[r]]


# --------------------------------------------------------------------------------------------------
# Set-up
# --------------------------------------------------------------------------------------------------


@dataclass
class DistContext:
    comm: TorchDistComm
    device: torch.device
    rank: int
    world: int
    local_rank: int
    threads: int
    heartbeat: Heartbeat

    def close(self) -> None:
        self.heartbeat.stop()
        self.comm.close()  # the background lane (sync.overlap) before the groups it uses
        if dist.is_initialized():
            dist.destroy_process_group()


_KEEP: list[Any] = []  # listening sockets a TCPStore server uses: alive as long as the process


def _loopback_store(rank: int, world: int, port: int, timeout: datetime.timedelta) -> Any:
    """The process group's TCPStore on 127.0.0.1 only: rank 0 binds the socket itself (torch's own
    server would listen on every interface) and hands it to the store."""
    import socket

    if rank == 0:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        _KEEP.append(sock)
        return dist.TCPStore(
            "127.0.0.1", port, world, is_master=True, timeout=timeout, master_listen_fd=sock.fileno()
        )
    return dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)


def pick_backend(choice: str, use_cuda: bool, local_processes: int, devices: int) -> str:
    """gloo on CPU; NCCL on CUDA unless several processes of this machine share a device, which NCCL
    refuses ("Duplicate GPU detected"): then gloo, which moves CUDA tensors through host memory."""
    if choice == "nccl" and not use_cuda:
        raise UserError(
            "config: runtime.dist_backend = 'nccl': NCCL needs CUDA (this run is on cpu); use gloo"
        )
    if choice == "nccl" and local_processes > devices:
        raise UserError(
            f"config: runtime.dist_backend = 'nccl': {local_processes} processes on this machine share {devices} "
            "CUDA device(s), and NCCL needs one device per process; use gloo, or fewer processes with "
            "runtime.workers_per_process workers each"
        )
    if choice != "auto":
        return choice
    return "nccl" if use_cuda and local_processes <= devices else "gloo"


def start(
    workers_per_process: int,
    device_kind: str,
    threads: int,
    timeout: float,
    dist_backend: str = "auto",
    shards: int = 1,
) -> DistContext:
    """Join the process group (env:// from torchrun), pin threads, pick the device. The launch and the
    layout of workers over its processes were checked before
    (:func:`adloco.config.checks.check_placement`)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world = int(os.environ["WORLD_SIZE"])
    use_cuda = uses_cuda(device_kind)
    if use_cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # Several processes with default threads on a few cores run several times slower: pin them.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n_threads = threads or max(1, cores // local_world)
    torch.set_num_threads(n_threads)
    store_file = os.environ.get(STORE_ENV)  # `adloco train --nproc`: a file store, no TCP listener
    backend = pick_backend(dist_backend, use_cuda, local_world, torch.cuda.device_count() if use_cuda else 0)
    limit = datetime.timedelta(seconds=timeout)
    device_id = device if backend == "nccl" else None
    rank = int(os.environ["RANK"])
    if store_file:
        store = dist.FileStore(store_file, world)
        dist.init_process_group(
            backend, timeout=limit, device_id=device_id, store=store, rank=rank, world_size=world
        )
    elif os.environ.get(LOOPBACK_ENV) == "1":  # `adloco train --nproc --max-restarts`: loopback only
        store = _loopback_store(rank, world, int(os.environ["MASTER_PORT"]), limit)
        dist.init_process_group(
            backend, timeout=limit, device_id=device_id, store=store, rank=rank, world_size=world
        )
    else:  # torchrun: env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
        dist.init_process_group(backend, timeout=limit, device_id=device_id)
    mesh = None
    if shards > 1:  # worker w on ranks w·k .. w·k + k − 1 (init_device_mesh's row-major layout)
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world // shards, shards), mesh_dim_names=("worker", "shard"))
    comm = TorchDistComm(workers_per_process, device, mesh=mesh)
    return DistContext(
        comm, device, dist.get_rank(), world, local_rank, n_threads, Heartbeat(dist.get_rank())
    )


def root_first(
    ctx: DistContext | None, fn: Callable[[], T], timeout: float, others: Callable[[], T] | None = None
) -> T:
    """Run ``fn`` on the root rank first (where the run continues from, tokenizer training, caches), then
    ``others`` (default ``fn``) on the rest.

    If the root fails with a user error, the others stop at once without repeating the message. The
    key the root answers under is new for every start (a restarted job may find an old one in a store
    that outlived it).
    """
    if ctx is None:
        return fn()
    root = ctx.comm.root
    nonce = ctx.comm.all_gather_json(uuid.uuid4().hex if ctx.rank == root else None)[root]
    key = f"{_STARTUP_KEY}/{nonce}"
    store = _store()
    if ctx.rank == root:
        try:
            out = fn()
        except UserError as exc:
            if store is not None:
                store.set(key, f"error:{exc}")
            raise
        except BaseException:
            if store is not None:
                store.set(key, f"error:rank {root} failed at start-up (see its output)")
            raise
        if store is not None:
            store.set(key, "ok")
        return out
    if store is not None:
        try:
            store.wait([key], datetime.timedelta(seconds=timeout))
            status = store.get(key).decode()
        except Exception as exc:  # noqa: BLE001 - the root (or the store) went away before saying anything
            raise CommFailure(
                "wait", "start-up", first_sentence(str(exc)) or f"no answer from rank {root}"
            ) from exc
        if status.startswith("error:"):
            raise PeerFailed(status[len("error:") :])
    return (others or fn)()


def elect_root(ctx: DistContext, newest: int) -> int:
    """The rank that holds the run directory: the one whose disk has the newest checkpoint of the run
    (``newest``: its round there, −1 for none), ties to the lowest rank; rank 0 when nobody has one.
    The machine that kept the run directory goes on writing it, whatever rank the restart gave it (the
    checkpoints themselves are on storage every rank reaches, each rank writing its own part)."""
    rounds = [int(x) for x in ctx.comm.all_gather_json(newest)]  # type: ignore[call-overload]
    best = max(rounds)
    root = rounds.index(best) if best >= 0 else 0
    ctx.comm.root = root
    return root


def check_same_data(comm: TorchDistComm, arrays: tuple[Any, ...]) -> None:
    """Every process must train on the same tokens (machines may differ in their corpus or cache):
    ``arrays`` are this process's token arrays; a rank whose differ from another's is one line."""
    fp = float(fingerprint_tokens(*arrays))
    got = comm.all_gather_rows({w: [fp] for w in comm.local_workers}, 1, "check", counted=0)
    odd = sorted({comm.owner(w) for w, (v,) in got.items() if v != fp})
    if odd:
        raise UserError(
            f"data: rank {comm.rank}'s tokens differ from rank(s) {', '.join(map(str, odd))}'s: every machine "
            "needs the same corpus; share data.cache_dir between machines or copy it from rank 0's"
        )


def fingerprint_tokens(*arrays: Any) -> int:
    """A 52-bit fingerprint of token arrays (exact in a float64, so it can travel in a scalar gather)."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(str(len(a)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return int(h.hexdigest()[:13], 16)


def failure_line(ctx: DistContext, exc: CommFailure, round_: int) -> str:
    """One line for a failed collective: this rank, the round, who stopped answering, and what failed."""
    silent = ctx.heartbeat.silent_ranks(ctx.world)
    if silent:
        who = (
            f"rank {silent[0]} stopped answering"
            if len(silent) == 1
            else (f"ranks {', '.join(map(str, silent))} stopped answering")
        )
    elif silent is None:
        who = "the rendezvous store is unreachable (the launcher or rank 0's machine went away)"
    else:
        who = "a peer closed its connection"
    when = f"round {round_}" if round_ > 0 else "start-up"
    return f"rank {ctx.rank}: {when}: {who} ({exc})"
