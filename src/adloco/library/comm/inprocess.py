"""Every worker in this process (the paper's simulated cluster on one device): the one-process case.

Each collective's partial already is the result, so data movement is free; accounting is done by
:class:`adloco.library.comm.base.Comm` exactly as for several processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from adloco.library.comm.base import Comm
from adloco.netmodel import Link

if TYPE_CHECKING:
    from adloco.library.comm.compressed import GroupOps


class InProcessComm(Comm):
    """All ``n_workers`` workers live in this process. ``link``: hold every counted collective back to
    its time on this modelled link, ``(bandwidth, latency)`` (:attr:`adloco.library.comm.Comm.link`)."""

    def __init__(self, n_workers: int, *, link: Link | tuple[float, float] | None = None) -> None:
        super().__init__(n_workers, range(n_workers), link=link)

    def _all_reduce(self, tensor: torch.Tensor, workers: Sequence[int]) -> None:
        return None

    def _broadcast(self, tensor: torch.Tensor, src: int, workers: Sequence[int]) -> None:
        return None

    def _all_gather_rows(self, rows: Mapping[int, Sequence[float]], width: int) -> dict[int, list[float]]:
        missing = set(range(self.n_workers)) - set(rows)
        if missing:
            raise RuntimeError(f"rows missing for workers {sorted(missing)}")
        return {w: [float(v) for v in rows[w]] for w in sorted(rows)}

    def _participants(self, workers: list[int]) -> GroupOps:
        from adloco.library.comm.compressed import InProcessGroup

        return InProcessGroup(len(workers))  # every participant is here: nothing moves
