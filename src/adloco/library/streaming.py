"""When Δ travels (ALGORITHM.md §13): the schedule of every fragment's launch and landing.

θ is synchronized in F = ``sync.fragments`` contiguous fragments of near-equal size (:func:`fragments`;
F = 1: all of θ at once); with an outer step that asks for the model's shapes (a matrix-aware factory),
fragments that end between whole tensors, as near to those as the tensors allow (:func:`tensor_fragments`).
The :class:`Schedule` says, after each inner step h of a round (h = H: the
round's end, phase 2 of ALGORITHM.md §6), which fragments launch their Δ and which land, and how the
landing is counted; the algorithm then calls each trainer's :meth:`~adloco.library.trainer.Trainer.prepare_sync`
and :meth:`~adloco.library.trainer.Trainer.perform_sync` from one place (:meth:`adloco.library.method.AdLoCo._synchronize`).

- ``sync.overlap: none`` (F = 1): Δ launched and landed at the round's end, on the critical path.
- ``delayed`` / ``eager``: Δ launched at the round's end on the background lane, landed at the end of the
  next round (behind its whole compute); eager also starts each worker from its own Δ's outer step.
- Streaming (F > 1, Streaming DiLoCo 2501.18512 with torchft's ``fragment_sync_delay`` τ and
  ``fragment_update_alpha`` α): fragment p lands at inner step p·H/F (fragment 0 at the round's end), launched
  τ steps earlier (on the lane when τ > 0), after which every worker's fragment becomes
  (1 − α)·θ_t[p] + α·θ_m[p]. Each collective moves P/F values: peak bytes per collective ÷ F, the same
  total.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adloco.library.comm.quantize import ErrorFeedback
from adloco.library.settings import Sync
from adloco.library.trainer import Flight, Trainer

log = logging.getLogger("adloco")


def fragments(n: int, count: int) -> list[slice]:
    """``count`` contiguous slices of ``n`` values, as near-equal as they go (the first n mod count get one
    more); together they cover every value once."""
    q, r = divmod(n, count)
    out, lo = [], 0
    for p in range(count):
        hi = lo + q + (p < r)
        out.append(slice(lo, hi))
        lo = hi
    return out


def tensor_fragments(sizes: Sequence[int], count: int) -> list[slice] | None:
    """``count`` contiguous slices of a flat layout of tensors of ``sizes`` (in its order) that end between
    whole tensors, each boundary the tensor end nearest to :func:`fragments`' even one; None where the
    tensors are too few for ``count`` non-empty fragments. What a matrix-aware outer step needs: whole
    tensors in each fragment (:meth:`adloco.library.algorithms.outer.OuterParams.shaped`)."""
    ends = list(itertools.accumulate(sizes))
    if count > len(ends):
        return None
    even = fragments(ends[-1], count)
    out, lo, i = [], 0, -1
    for p in range(1, count):
        # the cut after tensor j: later than the last cut, and leaving a tensor for each fragment after it
        j = min(range(i + 1, len(ends) - (count - p)), key=lambda j: abs(ends[j] - even[p].start))
        out.append(slice(lo, ends[j]))
        lo, i = ends[j], j
    return [*out, slice(lo, ends[-1])]


@dataclass(frozen=True)
class Due:
    """What happens to fragment p after an inner step: its Δ launched, landed, or both."""

    fragment: int
    launch: bool
    land: bool


class Schedule:
    """When each fragment's Δ is launched and lands, for one round of H inner steps (``sync.overlap``,
    ``sync.fragments``, ``sync.fragment_delay``; DDP has no rounds to overlap), and the one place both
    happen (:meth:`run`). It keeps the order of every launch (reductions land in that order) and the
    seconds waited for what ran behind compute."""

    def __init__(
        self,
        sync: Sync,
        H: int,
        ddp: bool,
        flats: Mapping[int, Any],
        feedback: Mapping[int, ErrorFeedback] | None,
        scratch: torch.Tensor,
    ) -> None:
        self.H = H
        self.flats, self.feedback, self.scratch = flats, feedback, scratch  # this process's workers
        if sync.fragments > scratch.numel():
            raise ValueError(
                f"sync.fragments = {sync.fragments}: more fragments than parameters ({scratch.numel()})"
            )
        self.streaming = sync.fragments > 1 and not ddp
        self.count = sync.fragments if self.streaming else 1
        self.tau = sync.fragment_delay if self.streaming else 0
        self.alpha = sync.fragment_alpha
        self.lag = 1 if sync.overlap != "none" and not ddp else 0  # rounds from launch to landing
        self.eager = self.lag > 0 and sync.overlap == "eager"
        every = H // self.count
        self._at = [p * every if p else H for p in range(self.count)]  # the step after which p lands
        self._launches = itertools.count()
        self.waited_s = 0.0  # seconds waited for what ran behind compute, since the last count

    @property
    def behind_compute(self) -> bool:
        """Whether Δ runs on the background lane (overlap, or streaming with τ > 0)."""
        return self.lag > 0 or self.tau > 0

    def due(self, h: int) -> list[Due]:
        """What is due after inner step h of the round (1 ≤ h ≤ H), fragment by fragment, in order."""
        out = []
        for p, at in enumerate(self._at):
            launch, land = h == at - self.tau, h == at
            if launch or land:
                out.append(Due(p, launch, land))
        return out

    def landing(self, round_: int) -> int:
        """The latest round (1-based) whose Δ lands at the end of round ``round_``: this one, or the one
        before (overlap)."""
        return round_ - self.lag

    def behind(self, p: int) -> float:
        """The share of a round's compute a landing collective of fragment p ran behind: a whole round
        (overlap), its τ steps (streaming), or none."""
        return 1.0 if self.lag else self.tau / self.H

    def mixes(self, p: int) -> bool:
        """Whether the workers' fragment is mixed when p lands (streaming; fragment 0 at the next start)."""
        return self.streaming and p > 0

    # -- the one place Δ is launched and landed ------------------------------------------------------
    def run(
        self,
        h: int,
        round_: int,
        trainers: Mapping[int, Trainer],
        members: Mapping[int, list[int]],
        senders: Mapping[int, list[int]],
        sizes: Mapping[int, int],
    ) -> None:
        """Launch and land what is due after inner step h of round ``round_`` (1-based): each trainer's
        Δ of a due fragment over its ``senders``, each weighted by its share of their ``sizes`` (examples
        or rows), and the due reductions landed. Where a fragment launches and lands at once (no overlap,
        or streaming without delay) each trainer's Δ lands before the next trainer's leaves. Every process
        calls it, in the same order."""
        at_once = not self.lag
        params = {w: flat.param for w, flat in self.flats.items()}
        weights = {w: sizes[w] / sum(sizes[x] for x in ws) for ws in senders.values() for w in ws}
        for d in self.due(h):
            if d.launch:
                for t in sorted(trainers):
                    if not senders[t]:
                        continue
                    trainers[t].prepare_sync(
                        d.fragment,
                        params,
                        weights,
                        senders[t],
                        members[t],
                        round=round_,
                        seq=next(self._launches),
                        behind=self.behind_compute,
                        from_starts=self.lag > 0,
                        keep_own=self.eager,
                        feedback=self.feedback,
                        scratch=self.scratch,
                    )
                    if d.land and at_once:
                        self._land(d.fragment, round_, trainers, members, only=t)
            if d.land and not (d.launch and at_once):
                self._land(d.fragment, round_, trainers, members)

    def _land(
        self,
        p: int,
        round_: int,
        trainers: Mapping[int, Trainer],
        members: Mapping[int, list[int]],
        only: int | None = None,
    ) -> None:
        """Land fragment p's reductions due at the end of round ``round_``'s step (every trainer's, or
        ``only``'s), in launch order. Streaming: a fragment whose average is not finite is not stepped,
        and the workers' fragment is mixed with θ (reset to it when not finite)."""
        last = round_ - self.lag
        for f in in_flight(trainers):
            if f.fragment != p or f.round > last or (only is not None and f.trainer != only):
                continue
            tr = trainers[f.trainer]
            self.waited_s += tr.receive(f)
            finite = not self.streaming or tr.finite(f)
            if not finite:
                log.warning(
                    f"round {round_}: trainer {f.trainer}: fragment {p}'s average is not finite; "
                    "its outer step skipped, the workers' fragment reset to θ"
                )
            tr.perform_sync(f, self.behind(p), step=finite)
            if self.mixes(p):
                flats = [self.flats[w] for w in members[f.trainer] if w in self.flats]
                tr.mix(p, flats, self.alpha, finite)

    def settle(self, trainers: Mapping[int, Trainer], whole: bool = False) -> bool:
        """Land everything in flight, on the critical path; the next round starts from every trainer's θ
        (no eager start); ``whole``: every worker's own start dropped too (streaming's own fragments: the
        model whole). Returns whether there was anything to do."""
        flights = in_flight(trainers)
        busy = bool(flights) or (whole and any(tr.starts for tr in trainers.values()))
        for f in flights:
            tr = trainers[f.trainer]
            self.waited_s += tr.receive(f)
            tr.perform_sync(f)
        for tr in trainers.values():
            tr.own.clear()
            if whole:
                tr.starts.clear()
        return busy

    def receive(self, trainers: Mapping[int, Trainer]) -> dict[int, torch.Tensor]:
        """Wait for every Δ in flight without applying it: trainer -> its average (where hosted)."""
        flights = in_flight(trainers)
        for f in flights:
            self.waited_s += trainers[f.trainer].receive(f)
        return {f.trainer: f.buf for f in flights}

    def restore(
        self,
        trainers: Mapping[int, Trainer],
        entries: Sequence[Mapping[str, Any]],
        averages: Mapping[int, torch.Tensor | None],
        members: Mapping[int, list[int]],
        like: torch.Tensor,
    ) -> None:
        """What was in flight when a state was written, landed already: each trainer's average is applied
        at the end of the next round, as it would have been. A trainer merged away by a resize loses its
        (ALGORITHM.md §13); without overlap it is applied now, once."""
        for e in entries:
            t = int(e["trainer"])
            tr = trainers.get(t)
            got = averages.get(t)
            if tr is None or (tr.hosted and got is None):
                continue
            buf = torch.empty_like(like) if got is None else got.to(like.device, torch.float32, copy=True)
            tr.restore_flight(e, buf, members[t], next(self._launches))
        if not self.lag:
            self.settle(trainers)


def in_flight(trainers: Mapping[int, Trainer]) -> list[Flight]:
    """Every reduction in flight (every trainer's, every fragment's), in launch order."""
    return sorted((f for tr in trainers.values() for f in tr.flights), key=lambda f: f.seq)
