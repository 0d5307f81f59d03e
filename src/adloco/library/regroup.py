"""Phase 4 of a round (ALGORITHM.md §6): trainers merge and workers move (ALGORITHM.md §3–4).

Which trainers merge and where workers go is decided from gathered scalars (:mod:`adloco.library.algorithms.merging`,
:mod:`adloco.library.algorithms.allocation`), the same on every process. What travels is θ and the outer state:
merged through the one reducer, sent to newcomers by :meth:`adloco.library.comm.Comm.send`, on the wire of θ
(``comm.theta_dtype``, ALGORITHM.md §9.4).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import torch

from adloco import events
from adloco.library.algorithms import allocation, merging
from adloco.library.algorithms.outer import OuterOptimizer
from adloco.library.comm.base import Comm, Part
from adloco.library.settings import FLOAT32, Merging, Wire
from adloco.library.trainer import Trainer, outer_layouts
from adloco.library.workers import Workers


class Regroup:
    """Merges and moves, with what they need from this process: the ``merge`` dial, the communicator and
    the wire of θ, this process's workers, a P-vector to stand in for values not held here, and a maker of
    fresh outer optimizers."""

    def __init__(
        self,
        m: Merging,
        comm: Comm,
        wire: Wire,
        workers: Workers,
        like: torch.Tensor,
        new_outer: Callable[[], OuterOptimizer],
    ) -> None:
        self.m, self.comm, self.wire, self.workers = m, comm, wire, workers
        self.like, self.new_outer = like, new_outer

    def due(self, requests: Mapping[int, int], round_: int) -> list[int]:
        """The trainers that merge at the end of round ``round_`` + 1: every ``merge.every`` rounds while
        more than one lives, those the policy selects (none: no merge)."""
        m = self.m
        if m.policy == "none" or len(requests) < 2 or (round_ + 1) % m.every != 0:
            return []
        merged = merging.select(dict(requests), m.policy, m.size)
        return merged if len(merged) >= 2 else []

    def run(
        self,
        trainers: dict[int, Trainer],
        old: dict[int, int],
        merged: list[int],
        members: Mapping[int, Sequence[int]],
        round_: int,
        speeds: Mapping[int, float] | None,
    ) -> tuple[events.Merge, events.Allocation, dict[int, int]]:
        """Merge the trainers ``merged`` (:meth:`merge`), share the workers again (by capacity when
        ``speeds`` are known and workers go by requests, else by ``merge.allocation``), send θ and the
        outer state to the workers that change trainer (:meth:`move`), reset those workers and drop the
        state of trainers no longer hosted here. Returns the events and the new allocation."""
        merge_event = self.merge(trainers, merged, members, round_)
        requests = {t: tr.request for t, tr in sorted(trainers.items())}
        # the workers of merged trainers hold the survivor's θ already
        current = {x: (merge_event.survivor if t in merged else t) for x, t in old.items()}
        if speeds is not None and self.m.allocation == "requests":  # by capacity: shares of the total speed
            new = allocation.by_capacity(requests, speeds, current)
        else:
            new = allocation.allocate(requests, self.comm.n_workers, current, self.m.allocation)
        moved = [x for x in sorted(new) if new[x] != current[x]]
        self.move(trainers, allocation.members(current), moved, new)
        changed = [x for x in sorted(new) if new[x] != old[x]]
        for x in changed:
            if x in self.workers.replicas:  # another trainer's worker now: fresh inner state, no old error
                if old[x] in trainers:
                    trainers[old[x]].forget(x)
                self.workers.reset(x)
        hosted = {new[x] for x in self.workers.replicas}
        for t, tr in trainers.items():
            if t not in hosted:  # keep heavy state only where a worker of the trainer lives
                tr.unhost(self.new_outer())
        return (
            merge_event,
            events.Allocation(round=round_ + 1, allocation=new, moved=moved, reset=changed),
            new,
        )

    def merge(
        self,
        trainers: dict[int, Trainer],
        merged: list[int],
        members: Mapping[int, Sequence[int]],
        round_: int,
    ) -> events.Merge:
        """The trainers ``merged`` (S) become the lowest id of them (ALGORITHM.md §3): θ_s = Σ_{j∈S} w_j θ_j
        with w by requests, and the outer state alike, on every worker of S, one reduction each among
        their union: a trainer's part is added by its first worker's process, so the sum over the union's
        processes counts every trainer exactly once; through a compressed wire every worker of the union
        is a participant, the others adding nothing. The survivor's request by ``merge.survivor_batch``;
        the others removed. Every process calls it."""
        local = self.workers.replicas
        requests = {t: tr.request for t, tr in sorted(trainers.items())}
        weights = merging.weights(requests, merged)
        survivor = merging.survivor(merged)
        union = sorted(x for t in merged for x in members[t])
        led = {members[t][0]: t for t in merged if members[t][0] in local}
        numel = self.like.numel()
        layouts = outer_layouts(trainers, merged, self.comm, numel)
        entries = {k: v for layout in layouts.values() for k, v in layout.items()}
        held = {t: {"theta": trainers[t].theta, **trainers[t].outer.state_dict()} for t in led.values()}
        out: dict[str, torch.Tensor] = {}
        for name, (shape, dtype) in [("theta", ([numel], torch.float32)), *sorted(entries.items())]:
            wide = dtype if dtype.is_floating_point else torch.float64  # a weighted sum of counts, rounded

            def add(x: int, buf: torch.Tensor, name: str = name) -> None:
                value = held[led[x]].get(name)
                if value is not None:
                    buf.add_(value, alpha=weights[led[x]])

            buf = torch.empty(shape, dtype=wide, device=self.like.device)
            parts: dict[int, Part] = {x: functools.partial(add, x) for x in sorted(led, key=lambda x: led[x])}
            wire = self._wire(shape, dtype)
            if wire.compressed:  # every worker of the union is a participant: the others add nothing
                parts.update({x: _nothing for x in union if x in local and x not in parts})
            self.comm.reduce(parts, union, "merge", buf, wire)
            out[name] = buf if wide == dtype else buf.round().to(dtype)
        tr = trainers[survivor]
        if any(x in local for x in union):
            tr.theta = out.pop("theta")
            tr.outer = self.new_outer()
            tr.outer.load_state_dict(out)
        tr.request = merging.merged_request(requests, merged, self.m.survivor_batch, survivor)
        for t in merged:
            if t != survivor:
                del trainers[t]
        return events.Merge(
            round=round_ + 1,
            merged=merged,
            survivor=survivor,
            weights=weights,
            request=tr.request,
            trainers_alive=len(trainers),
        )

    def move(
        self,
        trainers: Mapping[int, Trainer],
        holders: Mapping[int, Sequence[int]],
        moved: Sequence[int],
        new: Mapping[int, int],
    ) -> None:
        """θ and the outer state of every trainer that gains workers (``moved``, to ``new[x]``), from its
        first holder to each newcomer (:meth:`adloco.library.comm.Comm.send`: through a compressed wire every copy
        keeps the same decoded values). A process that receives a trainer it did not host makes room for
        it first. Every process calls it."""
        local, numel = self.workers.replicas, self.like.numel()
        for t in sorted({new[x] for x in moved}):
            tr = trainers[t]
            newcomers = [x for x in moved if new[x] == t]
            (layout,) = outer_layouts(trainers, [t], self.comm, numel).values()
            if any(x in local for x in newcomers):
                tr.host(self.like)
            held = tr.outer.state_dict() if tr.hosted else {}
            values = {
                k: held.get(k, torch.zeros(shape, dtype=dtype, device=self.like.device))
                for k, (shape, dtype) in layout.items()
            }
            theta = tr.theta if tr.theta is not None else self.like
            self.comm.send(theta, holders[t], newcomers, "move", self.wire)
            for v in values.values():
                self.comm.send(v, holders[t], newcomers, "move", self._wire(list(v.shape), v.dtype))
            if tr.hosted and values:  # every copy keeps what travelled (a compressed wire rounds it)
                tr.outer.load_state_dict(values)

    def _wire(self, shape: list[int], dtype: torch.dtype) -> Wire:
        """θ's wire for a vector in θ's flat layout (θ, a momentum); float32 for any other state."""
        return self.wire if shape == [self.like.numel()] and dtype == torch.float32 else FLOAT32


def _nothing(out: torch.Tensor) -> None:
    """The part of a worker that takes part in a compressed all-reduce without a value of its own."""
