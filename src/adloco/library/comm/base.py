"""The narrow communication protocol the round is written against, with byte accounting.

Collectives are addressed to logical WORKERS, not processes: a process passes the partial result of the
workers it hosts (for example Σ over its workers of w_m θ_m), and the backend combines the partials of
every process that hosts a worker of the group. The in-process backend is the case of one process, where
the partial already is the result.

Accounting is logical and identical in every backend (ALGORITHM.md §7): a collective among n workers of a B-byte
payload is one message when n > 1, and moves, summed over all workers,
``all_reduce``: 2(n−1)·B (ring), ``broadcast``: (n−1)·B, ``all_gather`` of B bytes each: n(n−1)·B.
What only serves logging or evaluation (losses, timings, validation results) is not counted.

Behind compute (``sync.overlap``, ALGORITHM.md §13): :meth:`Comm.reduce` with ``behind`` adds the parts at once
and runs the collective on the communicator's one background lane, a thread with collectives of its
own (its own process groups under torch.distributed, its own meeting point for threads), so that it
never interleaves with what the caller issues meanwhile; reductions land in the order launched.

With a :attr:`Comm.link` (``network.emulate``), every counted collective is held back: after the real
one, the process sleeps until its wall time is the collective's time on the modelled link
(:mod:`adloco.netmodel`, the model simulated time prices). It only sleeps: nothing decided depends on it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from adloco.library.settings import FLOAT32, Wire
from adloco.netmodel import Link, Network

if TYPE_CHECKING:
    from adloco.library.comm.compressed import GroupOps
    from adloco.library.comm.quantize import ErrorFeedback

T = TypeVar("T")

Part = Callable[[torch.Tensor], None]  # adds one worker's part of a reduction into the buffer given


@dataclass(frozen=True)
class CommRecord:
    kind: str  # what travelled: delta | grad | probe | merge | move | init | stats
    op: str  # all_reduce | broadcast | all_gather
    workers: int  # n: logical participants
    payload: int  # B: bytes each participant contributes (in the wire dtype)
    wire: int  # bytes moved over the network, summed over participants
    seconds: float = 0.0  # wall time this process spent in the collective (an emulated link's hold included)
    behind: float = 0.0  # the share of a round's compute it ran behind (sync.overlap: 1; 0: in the way)
    group: tuple[int, ...] = ()  # the workers taking part (empty: records from before they were named)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def hold(seconds: float) -> float:
    """Sleep ``seconds`` (nothing when <= 0); returns the seconds actually slept."""
    if seconds <= 0:
        return 0.0
    t0 = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - t0


def wire_bytes(op: str, n: int, payload: int) -> int:
    if n <= 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1) * payload
    if op == "broadcast":
        return (n - 1) * payload
    if op == "all_gather":
        return n * (n - 1) * payload
    raise ValueError(op)


class CommFailure(RuntimeError):
    """A collective failed or timed out: a peer died, hung, or the network broke."""

    def __init__(self, op: str, kind: str, detail: str) -> None:
        super().__init__(f"{op} of {kind} failed: {detail}")
        self.op, self.kind, self.detail = op, kind, detail


class Pending:
    """A reduction in flight (:meth:`Comm.reduce`). :meth:`wait` lands it: it returns whether this
    process hosts a worker of the group (only then is the buffer the sum) and the collective's records,
    which the caller accounts when it applies the result; a failure on the lane is raised there."""

    def __init__(self, future: Future[tuple[bool, list[CommRecord]]] | None, hosted: bool) -> None:
        self._future, self._hosted = future, hosted
        self.records: list[CommRecord] = []
        self.waited_s = 0.0  # seconds the caller waited for it

    @classmethod
    def landed(cls, hosted: bool, records: list[CommRecord]) -> Pending:
        """A reduction that has landed already (run in place, or restored from a checkpoint)."""
        out = cls(None, hosted)
        out.records = list(records)
        return out

    def wait(self) -> bool:
        """Block until the reduction has landed; whether this process hosts a worker of its group."""
        if self._future is not None:
            t0 = time.perf_counter()
            try:
                self._hosted, self.records = self._future.result()
            finally:
                self._future = None
                self.waited_s = time.perf_counter() - t0
        return self._hosted


@contextlib.contextmanager
def _named(kind: str) -> Iterator[None]:
    """Re-raise a backend's CommFailure with the kind of what was travelling."""
    try:
        yield
    except CommFailure as exc:
        if exc.kind:
            raise
        raise CommFailure(exc.op, kind, exc.detail) from exc.__cause__


def reduce_local(
    comm: Comm,
    workers: Sequence[int],
    kind: str,
    out: torch.Tensor,
    add: Callable[[int, torch.Tensor], None],
    wire: Wire = FLOAT32,
    feedback: Mapping[int, ErrorFeedback] | None = None,
    control: int = 0,
) -> bool:
    """``comm.reduce`` with ``comm``'s own workers of ``workers`` as the parts, each ``add(w, buffer)``."""
    parts: dict[int, Part] = {w: functools.partial(add, w) for w in workers if w in comm.local_workers}
    return comm.reduce(parts, workers, kind, out, wire, feedback, control).wait()


class Shards:
    """The ranks that hold one worker's replica between them (``runtime.shards``, ALGORITHM.md §12): ``size``
    of them, this rank the ``index``-th, in the torch.distributed ``group`` of the worker. Sums over the
    parameters (norms, dot products, the batch test's statistics) are summed over them before any decision.
    One rank (the default): every reduction is the value itself."""

    def __init__(self, size: int = 1, index: int = 0, group: object = None) -> None:
        self.size, self.index, self.group = size, index, group

    def _reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        if self.size > 1:
            import torch.distributed as dist

            dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=self.group)
        return t

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the worker's ranks, in place (returned)."""
        return self._reduce(t, "SUM")

    def max_(self, t: torch.Tensor) -> torch.Tensor:
        return self._reduce(t, "MAX")

    def split(self, n: int) -> tuple[int, int]:
        """This rank's rows [lo, hi) of ``n`` rows shared as evenly as they go (the first n mod k ranks get
        one more)."""
        q, r = divmod(n, self.size)
        lo = self.index * q + min(self.index, r)
        return lo, lo + q + (self.index < r)


class Comm:
    """Base class: accounting here, data movement in the backends' ``_`` methods.

    Every process calls every collective, in the same order (the round's decisions are replicated); a
    backend skips the ones that involve none of its workers.
    """

    # Whether every worker runs on this process's one device (in-process, threads): measured speeds then
    # differ by noise alone, and work is shared equally unless heterogeneity is emulated.
    one_device = True

    def __init__(
        self,
        n_workers: int,
        local_workers: Sequence[int],
        rank: int = 0,
        world: int = 1,
        link: Link | Network | tuple[float, float] | None = None,
    ) -> None:
        self.n_workers = n_workers
        self.local_workers = list(local_workers)
        self.rank, self.world = rank, world
        self.root = 0  # the rank that writes the run directory (receives fetch; sends a restart's state)
        self.shards = Shards()  # the ranks of this process's worker (one: a worker is one process)
        self.mesh: Any = None  # sharded workers: the (worker, shard) device mesh (TorchDistComm)
        self.records: list[CommRecord] = []
        self.link = link
        self._lanes = threading.local()  # on the background lane: .records of the collective running
        self._pool: ThreadPoolExecutor | None = None

    @property
    def link(self) -> Link | Network | None:
        """The modelled link every counted collective is held back to, or None (no delay; the default).

        Set it to ``(bandwidth, latency)`` (bytes per second, seconds per hop) or a
        :class:`adloco.netmodel.Link` (or a :class:`adloco.netmodel.Network`: links of their own, sites):
        after each collective that is counted (a positive payload), a
        process that hosts one of its workers sleeps ``max(0, modelled − measured)`` seconds, the modelled
        time being the one simulated time prices (ALGORITHM.md §7). Each process is held back on its own,
        after its own collective; contention between simultaneous collectives is not modelled."""
        return self._link

    @link.setter
    def link(self, value: Link | Network | tuple[float, float] | None) -> None:
        if value is None or isinstance(value, (Link, Network)):
            self._link = value
            return
        try:
            bandwidth, latency = value
        except (TypeError, ValueError):
            raise ValueError(f"link: {value!r} must be (bandwidth, latency), a Link or None") from None
        self._link = Link(bandwidth, latency)

    @property
    def at_root(self) -> bool:
        """Whether this process receives :meth:`fetch`: the root, or (sharded) one of its worker's ranks."""
        return self.rank // self.shards.size == self.root // self.shards.size

    def owner(self, worker: int) -> int:
        """The rank of the process hosting ``worker``."""
        return 0

    def workers_of(self, rank: int) -> list[int]:
        """The workers hosted by process ``rank``, ascending."""
        return [w for w in range(self.n_workers) if self.owner(w) == rank]

    def _hosts(self, workers: Sequence[int]) -> bool:
        """Whether this process hosts one of ``workers`` (takes part in their collective)."""
        return not set(self.local_workers).isdisjoint(workers)

    def _account(
        self,
        kind: str,
        op: str,
        workers: Sequence[int],
        payload: int,
        seconds: float = 0.0,
        here: bool = True,
    ) -> None:
        """Record a counted collective among ``workers`` that took ``seconds``; with a :attr:`link`, first
        hold it back to its modelled time where this process took part in it (``here``)."""
        n = len(workers)
        if self._link is not None and here and payload > 0:
            modelled = self._link.seconds_among(op, workers, payload)
            if modelled > seconds:
                seconds += hold(modelled - seconds)
        lane = getattr(self._lanes, "records", None)
        rec = CommRecord(
            kind, op, n, payload, wire_bytes(op, n, payload), seconds, float(lane is not None), tuple(workers)
        )
        (self.records if lane is None else lane).append(rec)

    @property
    def _behind(self) -> bool:
        """Whether the calling thread is the background lane."""
        return getattr(self._lanes, "records", None) is not None

    def drain(self) -> list[CommRecord]:
        """Records since the last drain (the round drains once a round)."""
        out, self.records = self.records, []
        return out

    # -- the protocol --------------------------------------------------------------------------------
    def reduce(
        self,
        parts: Mapping[int, Part],
        workers: Sequence[int],
        kind: str,
        out: torch.Tensor,
        wire: Wire = FLOAT32,
        feedback: Mapping[int, ErrorFeedback] | None = None,
        control: int = 0,
        weights: Mapping[int, float] | None = None,
        behind: bool = False,
    ) -> Pending:
        """The one reducer of the round: ``out`` ← Σ over ``workers`` of each worker's float32 part.

        ``parts`` holds this process's workers of the group (possibly none: every process calls every
        collective), each a function adding that worker's vector into the buffer it is given; in
        float32 they are summed in the order given, then all-reduced among the processes. Through a
        compressed ``wire`` every worker is a participant of the compressed all-reduce (its chunks
        encoded, each chunk summed in float32 in worker order by its owner, the sums encoded and
        gathered: the same bits in every backend), with ``feedback`` (each worker's error) when kept.
        ``control``: the last values of ``out`` are not part of the sum over workers but control that each
        process writes before the call (a stop request); they are summed over processes and never
        counted. Counted as one all-reduce of the body's bytes on the wire (ALGORITHM.md §7, ALGORITHM.md
        §9.4). ``weights``: every worker's weight in the sum (its part already weighted by it), which a
        codec that averages each value over its senders needs
        (:func:`adloco.library.comm.compressed.compressed_all_reduce`); None: all 1.

        Returns the reduction as a :class:`Pending`, whose :meth:`Pending.wait` says whether this process
        hosts a worker of the group (only then is ``out`` the sum). Without ``behind`` it has landed when
        this returns (its records counted already). ``behind``: behind compute, the parts are added now
        (they read the workers' parameters, which the caller may then change), the collective runs on the
        background lane, and ``out`` (with ``feedback``) belongs to it until :meth:`Pending.wait` returns;
        every process calls it where it would call it without; lanes keep the launch order."""
        hosted = any(w in self.local_workers for w in workers)
        body = out[: out.numel() - control] if control else out
        run: Callable[[], None]
        if not wire.compressed:
            body.zero_()
            for add in parts.values():
                add(body)
            nbytes = body.numel() * body.element_size()
            run = functools.partial(self._all_reduce_counted, out, workers, kind, nbytes)
        else:
            vectors = {}
            for w, add in parts.items():
                vectors[w] = torch.zeros_like(body)
                add(vectors[w])

            def run() -> None:
                got = self._reduce_compressed(vectors, workers, kind, wire, body.numel(), feedback, weights)
                if got is not None:
                    body.copy_(got)
                if control:
                    self._all_reduce_counted(out[-control:], workers, "control", 0)

        if not behind:
            run()
            return Pending.landed(hosted, [])
        self._prepare_lane(workers)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="adloco-comm")
        return Pending(self._pool.submit(self._on_lane, run, hosted), hosted)

    def _on_lane(self, run: Callable[[], None], hosted: bool) -> tuple[bool, list[CommRecord]]:
        self._lanes.records = []
        try:
            run()
            return hosted, self._lanes.records
        finally:
            self._lanes.records = None

    def _prepare_lane(self, workers: Sequence[int]) -> None:
        """Make, on the calling (main) thread, what the background lane's collective among ``workers`` will
        use (torch.distributed creates groups collectively, in one order on every rank)."""

    def close(self) -> None:
        """Stop the background lane (after what was launched has run)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _all_reduce_counted(
        self, tensor: torch.Tensor, workers: Sequence[int], kind: str, nbytes: int
    ) -> None:
        """In place: ``tensor`` ← Σ over the processes hosting ``workers`` of their partials; ``nbytes`` of
        it counted (0: control, not communication)."""
        t0 = time.perf_counter()
        with _named(kind):
            self._all_reduce(tensor, workers)
        if nbytes > 0:
            self._account(kind, "all_reduce", workers, nbytes, time.perf_counter() - t0, self._hosts(workers))

    def _reduce_compressed(
        self,
        parts: Mapping[int, torch.Tensor],
        workers: Sequence[int],
        kind: str,
        wire: Wire,
        numel: int,
        feedback: Mapping[int, ErrorFeedback] | None,
        weights: Mapping[int, float] | None = None,
    ) -> torch.Tensor | None:
        """The compressed all-reduce (:mod:`adloco.library.comm.compressed`) through the wire's codec, every worker
        of ``workers`` a participant, this process's with their vectors (``parts``); the sum where this
        process hosts one of ``workers``, else None. Counted as the codec's collective of its encoded
        bytes (a codec that sums: one all-reduce of B bytes, 2(n−1)·B on the wire, what the all-to-all and
        the all-gather move together, as much as a ring all-reduce)."""
        from adloco.library.comm.codecs import of
        from adloco.library.comm.compressed import collective, compressed_all_reduce

        codec = of(wire)
        assert codec is not None
        ops = self._participants(list(workers))
        local = [workers[i] for i in ops.local]
        vectors = [parts[w] for w in local]
        fb = [feedback[w] for w in local] if feedback is not None else None
        t0 = time.perf_counter()
        with _named(kind):
            out = self._guarded(
                "all_to_all",
                lambda: compressed_all_reduce(
                    vectors,
                    codec,
                    group_ops=ops,
                    feedback=fb,
                    numel=numel,
                    weights=None if weights is None else [weights[w] for w in workers],
                ),
            )
        op, payload = collective(numel, len(workers), codec)
        self._account(kind, op, workers, payload, time.perf_counter() - t0, bool(local))
        return out

    def send(
        self, tensor: torch.Tensor, holders: Sequence[int], to: Sequence[int], kind: str, wire: Wire = FLOAT32
    ) -> None:
        """The value the workers ``holders`` hold (equal copies, ``holders[0]`` the sender) to each worker of
        ``to``: one broadcast among the sender and that worker, in place. Through a compressed ``wire`` the
        value is encoded once where it is held (every process hosting a holder encodes its own copy, so all
        encode the same bytes), the bytes are sent, and every process hosting a holder or a worker of ``to``
        keeps the decoded value: every copy ends equal, bit for bit, the value rounded once by the codec
        (ALGORITHM.md §9.4). Every process calls it."""
        from adloco.library.comm.codecs import of

        src = holders[0]
        codec = of(wire)
        if codec is None:
            for x in to:
                self.broadcast(tensor, src, [src, x], kind)
            return
        flat = tensor.reshape(-1)
        if self._hosts(holders):
            payload = codec.encode(flat)
        else:  # filled by the broadcast, or a place to stand while others send
            payload = torch.zeros(codec.nbytes(flat.numel()), dtype=torch.uint8, device=tensor.device)
        for x in to:
            self.broadcast(payload, src, [src, x], kind)
        if self._hosts([*holders, *to]):
            codec.decode(payload, flat.numel(), out=flat)

    def broadcast(self, tensor: torch.Tensor, src: int, workers: Sequence[int], kind: str) -> None:
        """In place: every process hosting one of ``workers`` gets the tensor of worker ``src``'s process."""
        t0 = time.perf_counter()
        with _named(kind):
            self._broadcast(tensor, src, workers)
        self._account(
            kind,
            "broadcast",
            workers,
            tensor.numel() * tensor.element_size(),
            time.perf_counter() - t0,
            self._hosts(workers),
        )

    def all_gather_rows(
        self, rows: Mapping[int, Sequence[float]], width: int, kind: str, counted: int | None = None
    ) -> dict[int, list[float]]:
        """Every worker's row of ``width`` float64 scalars, on every process (rows keyed by worker).

        ``counted``: how many of a row's values the algorithm needs (None: all). Values that only serve
        logging and evaluation ride along uncounted; with ``counted=0`` the gather is not counted at all.
        """
        t0 = time.perf_counter()
        with _named(kind):
            out = self._all_gather_rows(rows, width)
        n = width if counted is None else counted
        if n > 0:
            self._account(kind, "all_gather", range(self.n_workers), n * 8, time.perf_counter() - t0)
        return out

    def fetch(self, tensor: torch.Tensor, src: int) -> None:
        """The root rank receives worker ``src``'s process's ``tensor`` (output, not training: not counted)."""

    def spread(self, tensor: torch.Tensor) -> None:
        """In place: every process gets the root's ``tensor`` (a restart's state; not counted)."""

    def all_gather_json(self, obj: object) -> list[object]:
        """Every process's JSON-able ``obj``, in rank order (metadata such as state layouts; not counted).

        JSON, never pickle: what travels between processes is data, not code."""
        return [json.loads(b) for b in self._all_gather_bytes(json.dumps(obj).encode())]

    # -- backends ------------------------------------------------------------------------------------
    def _all_reduce(self, tensor: torch.Tensor, workers: Sequence[int]) -> None:
        raise NotImplementedError

    def _broadcast(self, tensor: torch.Tensor, src: int, workers: Sequence[int]) -> None:
        raise NotImplementedError

    def _all_gather_rows(self, rows: Mapping[int, Sequence[float]], width: int) -> dict[int, list[float]]:
        raise NotImplementedError

    def _all_gather_bytes(self, data: bytes) -> list[bytes]:
        return [data]

    def _participants(self, workers: list[int]) -> GroupOps:
        """The compressed all-reduce's collectives among ``workers`` (every one a participant, in this
        order) as seen from this process: its own participants and how they meet the others'. A process
        hosting none of them still does what every process must (threads meet at every exchange; every
        rank creates every torch.distributed group): it gets a bystander's."""
        raise NotImplementedError

    def _guarded(self, op: str, fn: Callable[[], T]) -> T:
        """Run a collective's body; a backend turns its library's failures into :class:`CommFailure`."""
        return fn()
