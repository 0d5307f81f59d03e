"""DiLoCo, LocalSGD and DDP: :class:`adloco.method.AdLoCo` with parts turned off, as named methods."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from adloco.method import AdLoCo
from adloco.settings import AdaptiveBatch, Merging, Outer, Switch


class DiLoCo(AdLoCo):
    """DiLoCo (Douillard et al. 2023): H local steps, then an outer Nesterov step on the averaged
    pseudo-gradient; constant batch, one trainer (or K independent ones), no merging.

    ``outer`` defaults to Nesterov lr 0.7, momentum 0.9 (the DiLoCo paper's, tuned for H = 500)."""

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        inner_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        *,
        inner_steps: int,
        outer: Outer | None = None,
        trainers: int = 1,
        batch_size: int = 4,
        **kw: Any,
    ) -> None:
        _no(kw, "batch", "merge")
        super().__init__(
            model,
            inner_optimizer,
            inner_steps=inner_steps,
            trainers=trainers,
            outer=outer or Outer.nesterov(),
            batch=AdaptiveBatch("none", initial=batch_size, max=batch_size, statistics=False),
            merge=Merging("none"),
            switch=kw.pop("switch", Switch("accumulate")),
            **kw,
        )


class LocalSGD(DiLoCo):
    """LocalSGD (Stich 2019): local steps, then the workers' parameters averaged (outer ``average``).
    Give it a plain ``torch.optim.SGD`` as inner optimizer to match the paper."""

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        inner_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        *,
        inner_steps: int,
        **kw: Any,
    ) -> None:
        _no(kw, "outer")
        super().__init__(model, inner_optimizer, inner_steps=inner_steps, outer=Outer("average"), **kw)


class DDP(DiLoCo):
    """Synchronous data parallel: gradients averaged every step, so the workers stay identical; a round
    is only a reporting period of ``inner_steps`` steps."""

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        inner_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        *,
        inner_steps: int = 1,
        **kw: Any,
    ) -> None:
        _no(kw, "outer")
        super().__init__(
            model, inner_optimizer, inner_steps=inner_steps, outer=Outer("average"), ddp=True, **kw
        )


def _no(kw: Mapping[str, Any], *names: str) -> None:
    for n in names:
        if n in kw:
            raise ValueError(f"{n}: fixed by this method; use AdLoCo(...) to set it")
