"""torch.distributed: one process per worker, or per device hosting ``workers_per_process`` workers.

Launched by ``torchrun`` (one machine or many; c10d rendezvous) or by ``adloco train --nproc N``. gloo on
CPU, NCCL on CUDA. Process ``r`` hosts workers ``r·wpp .. r·wpp + wpp − 1`` and reduces them locally
before the collective, so the in-process backend is the one-process case of the same coordinator.

Groups: a collective among some workers runs in the process group of the ranks hosting them. Groups
are created on first use and cached by their rank set. Every rank issues every collective in the same
order (decisions are replicated), so every rank creates the same groups in the same order, as
``new_group`` requires, with no separate rebuild step after a merge or a reallocation.

Failure: collectives time out after ``runtime.timeout``. A heartbeat thread bumps a counter in the
rendezvous store every second; when a collective fails, the survivors read the counters twice and name
the ranks whose counter stood still (dead or hung), with the round, in one line, and exit non-zero.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from adloco.engine.comm import Comm, CommFailure
from adloco.errors import UserError

T = TypeVar("T")
_STARTUP_KEY = "adloco/startup"
EXIT_DISTRIBUTED = 3


class PeerFailed(UserError):
    """Another rank failed at start-up and already said why; this one exits quietly."""


class TorchDistComm(Comm):
    def __init__(self, n_workers: int, workers_per_process: int, device: torch.device) -> None:
        rank, world = dist.get_rank(), dist.get_world_size()
        wpp = workers_per_process
        super().__init__(n_workers, range(rank * wpp, (rank + 1) * wpp), rank, world)
        self.wpp = wpp
        self.device = device
        self._groups: dict[tuple[int, ...], Any] = {}

    def owner(self, worker: int) -> int:
        return worker // self.wpp

    def _ranks(self, workers: Sequence[int]) -> tuple[int, ...]:
        return tuple(sorted({self.owner(w) for w in workers}))

    def _group(self, ranks: tuple[int, ...]) -> Any:
        if len(ranks) == self.world:
            return None  # the default (world) group
        g = self._groups.get(ranks)
        if g is None:  # every rank gets here in the same order: see the module docstring
            g = self._guard("new_group", lambda: dist.new_group(list(ranks)))
            self._groups[ranks] = g
        return g

    def _guard(self, op: str, fn: Callable[[], T]) -> T:
        """Run a torch.distributed call; any failure becomes a CommFailure (the caller adds the kind)."""
        try:
            return fn()
        except Exception as exc:  # gloo and NCCL raise RuntimeError subclasses with their own text
            raise CommFailure(op, "", _first_sentence(str(exc)) or type(exc).__name__) from exc

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
        self._guard("all_gather", lambda: dist.all_reduce(buf))
        return {w: [float(x) for x in r] for w, r in enumerate(buf.cpu().tolist())}

    def fetch(self, tensor: torch.Tensor, src: int) -> None:
        s = self.owner(src)
        if s == 0:
            return
        if self.rank == s:
            self._guard("send", lambda: dist.send(tensor, dst=0))
        elif self.rank == 0:
            self._guard("recv", lambda: dist.recv(tensor, src=s))

    def barrier(self) -> None:
        self._guard("barrier", lambda: dist.barrier())


def _first_sentence(text: str) -> str:
    """gloo/NCCL error text without source locations, cut to its first sentence."""
    text = re.sub(
        r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text.strip().splitlines()[0] if text.strip() else ""
    )
    return re.split(r"(?<=[a-z0-9\]])\. ", text, maxsplit=1)[0][:200]


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
        if dist.is_initialized():
            dist.destroy_process_group()


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def start(
    n_workers: int, workers_per_process: int, device_kind: str, threads: int, timeout: float
) -> DistContext:
    """Join the process group (env:// from torchrun), pin threads, pick the device, check the layout."""
    if not launched_by_torchrun():
        raise UserError(
            "config: runtime.backend = 'torchdist': start with `torchrun --nproc-per-node N -m adloco train ...` "
            "or `adloco train --nproc N ...`"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world = int(os.environ["WORLD_SIZE"])
    if n_workers != world * workers_per_process:
        raise UserError(
            f"config: algorithm.workers = {n_workers}: must equal processes ({world}) x "
            f"runtime.workers_per_process ({workers_per_process})"
        )
    use_cuda = device_kind == "cuda" or (device_kind == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        raise UserError("config: runtime.device = 'cuda': no CUDA device is available (use 'auto' or 'cpu')")
    if use_cuda:
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # Several processes with default threads on a few cores run several times slower: pin them.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n_threads = threads or max(1, cores // local_world)
    torch.set_num_threads(n_threads)
    from adloco.launch import STORE_ENV

    store_file = os.environ.get(STORE_ENV)  # `adloco train --nproc`: a file store, no TCP listener
    backend = "nccl" if use_cuda else "gloo"
    limit = datetime.timedelta(seconds=timeout)
    device_id = device if use_cuda else None
    if store_file:
        store = dist.FileStore(store_file, world)
        rank = int(os.environ["RANK"])
        dist.init_process_group(
            backend, timeout=limit, device_id=device_id, store=store, rank=rank, world_size=world
        )
    else:  # torchrun: env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
        dist.init_process_group(backend, timeout=limit, device_id=device_id)
    comm = TorchDistComm(n_workers, workers_per_process, device)
    return DistContext(
        comm, device, dist.get_rank(), world, local_rank, n_threads, Heartbeat(dist.get_rank())
    )


def root_first(ctx: DistContext | None, fn: Callable[[], T], timeout: float) -> T:
    """Run ``fn`` on rank 0 first (tokenizer training, caches), then on the others.

    If rank 0 fails with a user error, the others stop at once without repeating the message.
    """
    if ctx is None:
        return fn()
    store = _store()
    if ctx.rank == 0:
        try:
            out = fn()
        except UserError as exc:
            if store is not None:
                store.set(_STARTUP_KEY, f"error:{exc}")
            raise
        except BaseException:
            if store is not None:
                store.set(_STARTUP_KEY, "error:rank 0 failed at start-up (see its output)")
            raise
        if store is not None:
            store.set(_STARTUP_KEY, "ok")
        return out
    if store is not None:
        try:
            store.wait([_STARTUP_KEY], datetime.timedelta(seconds=timeout))
            status = store.get(_STARTUP_KEY).decode()
        except Exception as exc:  # noqa: BLE001 - rank 0 (or the store) went away before saying anything
            raise CommFailure(
                "wait", "start-up", _first_sentence(str(exc)) or "no answer from rank 0"
            ) from exc
        if status.startswith("error:"):
            raise PeerFailed(status[len("error:") :])
    return fn()


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
