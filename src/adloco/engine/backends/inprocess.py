"""Every worker in this process (the paper's simulated cluster on one device): the one-process case.

Each collective's partial already is the result, so data movement is free; accounting is done by
:class:`adloco.engine.comm.Comm` exactly as for several processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from adloco.engine.comm import Comm


class InProcessComm(Comm):
    def __init__(self, n_workers: int) -> None:
        super().__init__(n_workers, range(n_workers))

    def _all_reduce(self, tensor: torch.Tensor, workers: Sequence[int]) -> None:
        return None

    def _broadcast(self, tensor: torch.Tensor, src: int, workers: Sequence[int]) -> None:
        return None

    def _all_gather_rows(self, rows: Mapping[int, Sequence[float]], width: int) -> dict[int, list[float]]:
        missing = set(range(self.n_workers)) - set(rows)
        if missing:
            raise RuntimeError(f"rows missing for workers {sorted(missing)}")
        return {w: [float(v) for v in rows[w]] for w in sorted(rows)}
