"""DiLoCo, LocalSGD and DDP: :class:`adloco.method.AdLoCo` with parts turned off, as named methods.

Each takes its defaults from the method presets of :data:`adloco.settings.PRESETS`, the table
``adloco train``'s ``algorithm.method`` reads: one trainer, a constant batch (never capped to b_max), no
merging, and its outer step (DiLoCo: Nesterov with the ``outer`` section's lr 0.7 and momentum 0.9;
LocalSGD and DDP: averaging). As in a config, a preset only fills what you leave unset: any dial passed
explicitly wins (``DiLoCo(..., batch=AdaptiveBatch("norm"))`` is DiLoCo with the norm test).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from adloco.method import AdLoCo
from adloco.settings import PRESETS, AdaptiveBatch, Merging, Outer, Switch, preset


class DiLoCo(AdLoCo):
    """DiLoCo (Douillard et al. 2023): H local steps, then an outer Nesterov step on the averaged
    pseudo-gradient; constant batch, one trainer (or K independent ones), no merging.

    ``batch_size``: the rows of every worker's inner step (default: the ``batch`` section's initial
    request, 4; or give a whole ``batch=AdaptiveBatch(...)``). In the hooked form (``with algo:``) your
    loader decides the rows: pass ``batch_size``, or ``totals.examples`` is None (unknown) rather than a
    number adloco never saw."""

    METHOD: ClassVar[str] = "diloco"

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        inner_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        *,
        batch_size: int | None = None,
        **kw: Any,
    ) -> None:
        m = self.METHOD
        if batch_size is not None:
            if "batch" in kw:
                raise ValueError("batch_size: give batch_size or batch=AdaptiveBatch(...), not both")
            if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
                raise ValueError(f"batch_size = {batch_size!r}: must be an integer >= 1")
            kw["batch"] = preset(
                m, AdaptiveBatch, initial=batch_size, max=max(batch_size, AdaptiveBatch().max)
            )
        kw.setdefault("trainers", PRESETS[m]["algorithm"]["trainers"])
        for name, cls in (("outer", Outer), ("batch", AdaptiveBatch), ("merge", Merging), ("switch", Switch)):
            if kw.get(name) is None:
                kw[name] = preset(m, cls)
        super().__init__(model, inner_optimizer, **kw)
        self.stated_batch = batch_size


class LocalSGD(DiLoCo):
    """LocalSGD (Stich 2019): local steps, then the workers' parameters averaged (outer ``average``).
    Give it a plain ``torch.optim.SGD`` as inner optimizer to match the paper."""

    METHOD: ClassVar[str] = "localsgd"


class DDP(DiLoCo):
    """Synchronous data parallel: gradients averaged every step, so the workers stay identical; a round
    is only a reporting period of ``inner_steps`` steps."""

    METHOD: ClassVar[str] = "ddp"
    ddp = True


METHOD_CLASSES: dict[str, type[AdLoCo]] = {
    "adloco": AdLoCo,
    "diloco": DiLoCo,
    "localsgd": LocalSGD,
    "ddp": DDP,
}
assert set(METHOD_CLASSES) == set(PRESETS)
