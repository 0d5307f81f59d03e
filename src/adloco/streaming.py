"""Streaming fragments (``comm.fragments``, ALGORITHM.md §13; Streaming DiLoCo, arXiv 2501.18512, with
torchft's ``fragment_sync_delay`` and ``fragment_update_alpha``): a mixin of :class:`adloco.method.AdLoCo`.

The flat parameters are cut into F contiguous fragments of near-equal size. Fragment p is synchronized at
inner step p·H/F of every round, fragment 0 at the round's end (phase 2 of :mod:`adloco.sync`): its
Δ_p = Σ_m (n_m / n)(θ_t[p] − θ_m[p]) is all-reduced, launched τ = ``fragment_delay`` steps earlier (on the
communicator's background lane when τ > 0: the workers go on training meanwhile), the trainer's outer
step is taken on θ_t[p] and its momentum, and every worker's fragment becomes (1 − α)·θ_t[p] + α·θ_m[p].
Each collective moves P/F values: peak bytes per collective ÷ F, the same total.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import torch

from adloco.comm.base import Part, Pending

if TYPE_CHECKING:
    from adloco.comm.base import Comm
    from adloco.replica import Replica
    from adloco.round import TrainerState
    from adloco.settings import Wire
    from adloco.sync import Flight

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


class Streaming:
    """:meth:`_streaming`, called after every inner step, and the round-end fragment (:meth:`_fragment_end`)."""

    if TYPE_CHECKING:  # what the algorithm object provides
        comm: Comm
        device: torch.device
        wire: Wire
        replicas: dict[int, Replica]
        trainers: dict[int, TrainerState]
        H: int
        round: int
        ddp: bool
        _flights: list[Flight]
        _fragments: list[slice]
        _rows: dict[int, int]

        @property
        def alive(self) -> list[int]: ...
        def members(self) -> dict[int, list[int]]: ...
        def _local(self, workers: list[int]) -> list[int]: ...
        def _land(self, f: Flight, behind: float = 0.0, step: bool = True) -> None: ...

    @property
    def streaming(self) -> bool:
        """Whether Δ travels in fragments (``comm.fragments`` > 1; never for DDP)."""
        return self.wire.fragments > 1 and not self.ddp

    def _streaming(self, h: int) -> None:
        """After the h-th inner step of the round (every local worker's): launch the fragments due τ steps
        before their step, land those due now."""
        if not self.streaming:
            return
        every, tau = self.H // self.wire.fragments, self.wire.fragment_delay
        for p in range(self.wire.fragments):
            at = p * every if p else self.H
            if h == at - tau and (p or tau):  # fragment 0 without delay: phase 2 launches it
                self._launch_fragment(p)
            if p and h == at:
                self._land_fragment(p)

    def _fragment_end(self) -> None:
        """Phase 2 when streaming: fragment 0, launched τ steps ago or now, lands (the workers' fragment 0
        is mixed when they start the next round: :meth:`adloco.sync.Synchronization._start_next`)."""
        if not self.wire.fragment_delay:
            self._launch_fragment(0)
        self._land_fragment(0, mix=False)

    def _launch_fragment(self, p: int) -> None:
        """Every trainer's Δ of fragment p over all its workers, weighted by their rows per step."""
        from adloco.sync import Flight

        part = self._fragments[p]
        behind = self.wire.fragment_delay > 0
        for t, ws in sorted(self.members().items()):
            tr = self.trainers[t]
            total = sum(self._rows[w] for w in ws)
            theta = tr.theta

            def add(
                w: int, out: torch.Tensor, theta: torch.Tensor | None = theta, total: int = total
            ) -> None:
                assert theta is not None
                diff = theta[part] - self.replicas[w].flat.param[part]
                out.add_(diff, alpha=self._rows[w] / total)

            parts: dict[int, Part] = {w: functools.partial(add, w) for w in self._local(ws)}
            buf = torch.empty(part.stop - part.start, device=self.device)
            if behind:
                pending = self.comm.reduce_async(parts, ws, "delta", buf, self.wire)
            else:
                hosted = self.comm.reduce(parts, ws, "delta", buf, self.wire)
                pending = Pending.landed(hosted, [])
            self._flights.append(Flight(t, pending, buf, list(ws), list(ws), self.round + 1, fragment=p))

    def _land_fragment(self, p: int, mix: bool = True) -> None:
        """Fragment p's outer step for every trainer (skipped, with a warning, where its average is not
        finite); with ``mix``, every local worker's fragment becomes (1 − α)·θ_t[p] + α·θ_m[p]."""
        part, alpha = self._fragments[p], self.wire.fragment_alpha
        share = self.wire.fragment_delay / self.H
        members = self.members()
        for f in [f for f in self._flights if f.fragment == p]:
            tr = self.trainers[f.trainer]
            f.pending.wait()
            finite = tr.theta is None or bool(torch.isfinite(f.buf).all())
            if not finite:
                log.warning(
                    f"round {self.round + 1}: trainer {f.trainer}: fragment {p}'s average is not finite; "
                    "its outer step skipped, the workers' fragment reset to θ"
                )
            self._land(f, behind=share, step=finite)
            if tr.theta is None or not mix:
                continue
            for w in self._local(members[f.trainer]):
                flat = self.replicas[w].flat
                x = flat.param[part]
                if finite:
                    x.mul_(alpha).add_(tr.theta[part], alpha=1.0 - alpha)
                else:
                    x.copy_(tr.theta[part])
                flat.push()
