"""One trainer (ALGORITHM.md §0) and its outer synchronization, fragment by fragment.

A :class:`Trainer` exists on every process (every process takes every decision, and calls every
collective). Everywhere it holds the replicated part: its request and its learning-rate state. Where one
of its workers lives it also holds θ_t, the outer optimizer, and the starts of its local workers; and on
every process, the reductions of its Δ in flight (:class:`Flight`: every process calls every collective,
those hosting none of its workers with nothing to add).

Its synchronization is written as torchft writes a streaming fragment's: :meth:`Trainer.prepare_sync`
launches the reduction of one fragment's Δ (all of θ unless ``sync.fragments`` > 1), now or on the
communicator's background lane; :meth:`Trainer.perform_sync` waits for it and takes the outer step on
that fragment. *When* each happens is the schedule's, which calls both from one place
(:meth:`adloco.library.streaming.Schedule.run`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adloco.library.algorithms.outer import OuterOptimizer
from adloco.library.comm.base import Comm, CommRecord, Part, Pending
from adloco.library.comm.quantize import ErrorFeedback
from adloco.library.settings import Wire


@dataclass
class Flight:
    """A trainer's Δ of one fragment in flight: its reduction and the buffer it lands in, the finite workers
    that sent it and the trainer's members then, the round that made it (1-based) and its place in the
    order of every launch (reductions land in the order launched)."""

    trainer: int
    fragment: int
    pending: Pending
    buf: torch.Tensor
    sent: list[int]
    members: list[int]
    round: int
    seq: int
    received: bool = False


class Trainer:
    """One trainer: its request b, learning-rate state (ALGORITHM.md §10) and, where hosted, θ_t (P float32
    values, the flat layout), its outer optimizer, its local workers' starts, and its Δ in flight.

    ``parts``: the slices of θ that synchronize apart (streaming fragments, ALGORITHM.md §13; one slice
    of all of θ otherwise)."""

    def __init__(
        self, id: int, request: int, outer: OuterOptimizer, parts: Sequence[slice], comm: Comm, wire: Wire
    ) -> None:
        self.id, self.request = id, request
        self.outer = outer
        self.parts = list(parts)
        self.comm, self.wire = comm, wire
        self.theta: torch.Tensor | None = None  # (P,) flat parameters, where one of its workers lives
        self.b0: float | None = None  # rows of its workers' first steps (ALGORITHM.md §10; None: not planned)
        self.noise: float | None = None  # B̂: moving average of the norm test's σ̂²/‖ḡ‖² (lr_scaling gain)
        self.lr_ratio = 1.0  # r_t this round: the lr multiplier is √r_t (r_t for SGD), capped
        self.flights: list[Flight] = []  # its Δ in flight, in launch order
        self.starts: dict[int, torch.Tensor] = {}  # local worker -> where it starts the round, if not θ
        self.own: dict[int, torch.Tensor] = {}  # local worker -> its own Δ (eager), until its next start
        self._snapshot: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None

    # -- what it holds -------------------------------------------------------------------------------
    @property
    def hosted(self) -> bool:
        return self.theta is not None

    def host(self, like: torch.Tensor) -> None:
        """Make room for θ (zeros) where the trainer was not hosted: its values are about to arrive."""
        if self.theta is None:
            self.theta = torch.zeros_like(like)

    def unhost(self, outer: OuterOptimizer) -> None:
        """No worker of the trainer lives here any more: drop θ, the outer state and the starts."""
        self.theta, self.outer, self._snapshot = None, outer, None
        self.starts.clear()
        self.own.clear()

    def forget(self, w: int) -> None:
        """Worker w no longer serves this trainer (it moved): its start and own Δ go."""
        self.starts.pop(w, None)
        self.own.pop(w, None)

    # -- one fragment's synchronization ---------------------------------------------------------------
    def prepare_sync(
        self,
        p: int,
        params: Mapping[int, torch.Tensor],
        weights: Mapping[int, float],
        senders: Sequence[int],
        members: Sequence[int],
        *,
        round: int,
        seq: int,
        behind: bool,
        from_starts: bool,
        keep_own: bool,
        feedback: Mapping[int, ErrorFeedback] | None,
        scratch: torch.Tensor,
    ) -> None:
        """Launch fragment p's Δ_p = Σ_m w_m (s_m[p] − θ_m[p]) over ``senders`` (every process calls it;
        ``params`` holds this process's senders' flat parameters θ_m, ``weights`` every sender's w_m).
        s_m is θ_t, or with ``from_starts`` where the worker started the round (its eager start). On the
        background lane when ``behind``, else now. ``keep_own``: keep each local worker's own s_m − θ_m
        for its eager start (:meth:`start_next`)."""
        part = self.parts[p]
        theta = self.theta

        def add(w: int, out: torch.Tensor) -> None:
            start = self.starts.get(w, theta) if from_starts else theta
            assert start is not None
            own = torch.sub(start[part], params[w][part], out=scratch[: out.numel()])  # s_m − θ_m
            if keep_own:
                own = self.own[w] = own.clone()
            out.add_(own, alpha=weights[w])

        parts: dict[int, Part] = {w: functools.partial(add, w) for w in senders if w in params}
        buf = torch.empty(part.stop - part.start, device=scratch.device)
        pending = self.comm.reduce(
            parts, senders, "delta", buf, self.wire, feedback, weights=weights, behind=behind
        )
        self.flights.append(Flight(self.id, p, pending, buf, list(senders), list(members), round, seq))

    def receive(self, f: Flight) -> float:
        """Wait for ``f``; a worker of the trainer left out of it (non-finite) gets the average too, its
        process possibly outside the reduction. Returns the seconds waited (0 when received already)."""
        if f.received:
            return 0.0
        f.pending.wait()
        if len(f.sent) < len(f.members):
            self.comm.broadcast(f.buf, f.sent[0], f.members, "delta")
        f.received = True
        return f.pending.waited_s

    def perform_sync(self, f: Flight, behind: float = 0.0, step: bool = True) -> float:
        """Land ``f``: the outer step on its fragment of θ (and of the outer state) with the average; its
        collectives counted now, as run behind that share of a round's compute (1: a whole round; 0: on
        the critical path). Returns the seconds waited."""
        waited = self.receive(f)
        if f.pending.records:  # what ran on the background lane (what ran now was counted as it ran)
            self.comm.records.extend(
                r if r.behind == behind else dataclasses.replace(r, behind=behind) for r in f.pending.records
            )
        if self.theta is not None and step:
            with torch.no_grad():
                self.outer.step(self.theta, f.buf, self.parts[f.fragment])
        self.flights.remove(f)
        return waited

    def finite(self, f: Flight) -> bool:
        """Whether ``f``'s average is finite (where it is known: where the trainer is hosted)."""
        self.receive(f)
        return self.theta is None or bool(torch.isfinite(f.buf).all())

    def mix(self, p: int, flats: Sequence[Any], alpha: float, finite: bool) -> None:
        """Streaming: every local worker's fragment p becomes (1 − α)·θ_t[p] + α·θ_m[p] (θ_t[p] when the
        average was not finite)."""
        part, theta = self.parts[p], self.theta
        if theta is None:
            return
        for flat in flats:
            x = flat.param[part]
            if finite:
                x.mul_(alpha).add_(theta[part], alpha=1.0 - alpha)
            else:
                x.copy_(theta[part])
            flat.push()

    def start_next(
        self, w: int, param: torch.Tensor, fresh: bool, streaming: bool, alpha: float
    ) -> torch.Tensor:
        """Where local worker w starts the next round: θ_t; or (eager) the outer step of its own Δ taken
        from there, to be corrected when the average lands; or (streaming) its own parameters ``param``
        with fragment 0 mixed with θ, the other fragments as their last synchronization left them.
        ``fresh`` (after a merge, a move, or a non-finite round): θ."""
        theta = self.theta
        assert theta is not None
        own = self.own.pop(w, None)
        if fresh or (own is None and not streaming):
            self.starts.pop(w, None)
            return theta
        start = self.starts.get(w)
        if start is None:
            start = self.starts[w] = torch.empty_like(theta)
        if own is not None:
            return self.outer.trial(theta, own, start)
        part = self.parts[0]
        start.copy_(param)
        start[part].mul_(alpha).add_(theta[part], alpha=1.0 - alpha)
        return start

    # -- an aborted round ----------------------------------------------------------------------------
    def snapshot(self) -> None:
        """Keep θ and the outer state as they are now (a round's start), to undo the round in place."""
        if self.theta is not None:
            state = {k: v.clone() for k, v in self.outer.state_dict().items()}
            self._snapshot = (self.theta.clone(), state)

    def undo(self, round: int) -> None:
        """An aborted round: its reductions waited for and dropped (launched in ``round``, 1-based), θ and
        the outer state back to the snapshot, when one was taken."""
        for f in [f for f in self.flights if f.round >= round]:
            f.pending.wait()
            self.flights.remove(f)
        if self._snapshot is not None and self.theta is not None:
            theta, state = self._snapshot
            self.theta.copy_(theta)
            self.outer.load_state_dict(state)

    # -- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """θ and the outer state, and the average of a Δ in flight that landed, not applied (``pending``)."""
        assert self.theta is not None
        out = {"theta": self.theta, **self.outer.state_dict()}
        for f in self.flights:
            if f.received:
                out["pending"] = f.buf
        return out

    def load_state_dict(self, saved: Mapping[str, torch.Tensor], device: torch.device) -> None:
        """θ and the outer state back from :meth:`state_dict` (``pending`` is the schedule's to restore)."""
        self.theta = saved["theta"].to(device, torch.float32, copy=True)
        self.outer.load_state_dict(
            {k: v.to(device) for k, v in saved.items() if k not in ("theta", "pending")}
        )

    def restore_flight(
        self, entry: Mapping[str, Any], buf: torch.Tensor, members: list[int], seq: int
    ) -> None:
        """A Δ that was in flight when a state was written, landed already (its average ``buf``)."""
        records = [CommRecord(**{**r, "group": tuple(r.get("group", ()))}) for r in entry["records"]]
        pending = Pending.landed(self.hosted, records)
        self.flights.append(
            Flight(self.id, 0, pending, buf, members, members, int(entry["round"]), seq, received=True)
        )


def initial_thetas(
    trainers: Mapping[int, Trainer],
    members: Mapping[int, list[int]],
    params: Mapping[int, torch.Tensor],
    comm: Comm,
    like: torch.Tensor,
    broadcast: bool,
) -> None:
    """Each trainer's θ where one of its workers lives, taken from its first local worker's parameters
    (``params``); with ``broadcast``, from its first worker everywhere (counted as ``init``)."""
    for t, ws in members.items():
        mine = [w for w in ws if w in params]
        if mine:
            trainers[t].theta = params[mine[0]].detach().clone()
    if broadcast:
        for t, ws in sorted(members.items()):
            theta = trainers[t].theta
            comm.broadcast(theta if theta is not None else like, ws[0], ws, "init")


Layout = dict[str, tuple[list[int], torch.dtype]]  # a flat outer state's entries: shape and dtype


def outer_layouts(
    trainers: Mapping[int, Trainer], ids: Sequence[int], comm: Comm, numel: int
) -> dict[int, Layout]:
    """The entries of the outer state of trainers ``ids`` (:meth:`adloco.library.algorithms.outer.OuterOptimizer.
    state_dict`), the same on every process: a preset's are known; any other optimizer's are what the
    processes hosting each trainer hold, gathered (a JSON gather, not counted; sharded workers: from the
    ranks of this shard index). Every process calls it, with the same ``ids``."""
    known = {t: trainers[t].outer.layout(numel) for t in ids}
    if all(v is not None for v in known.values()):
        return {t: v for t, v in known.items() if v is not None}
    mine = {
        str(t): {
            k: [list(v.shape), str(v.dtype).removeprefix("torch.")]
            for k, v in trainers[t].outer.state_dict().items()
        }
        for t in ids
        if trainers[t].hosted
    }
    out: dict[int, Layout] = {t: {} for t in ids}
    for q, part in enumerate(comm.all_gather_json(mine)):
        if q % comm.shards.size != comm.shards.index:
            continue
        for t, entries in dict(part).items():  # type: ignore[call-overload]
            for k, (shape, dtype) in entries.items():
                out[int(t)][k] = (list(shape), getattr(torch, dtype))
    return {t: dict(sorted(v.items())) for t, v in out.items()}
