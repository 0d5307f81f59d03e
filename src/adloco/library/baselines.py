"""DiLoCo, LocalSGD and DDP: :class:`adloco.library.method.AdLoCo` with parts turned off, as named methods.

Each takes its defaults from the method presets of :data:`adloco.library.presets.PRESETS`, the table
``adloco train``'s ``algorithm.method`` reads: one trainer, a constant batch (never capped to b_max), no
merging, and its outer step (DiLoCo: SGD at lr 0.5 without momentum, measured best at these sizes, where
the paper's is Nesterov at lr 0.7, momentum 0.9, ``outer=Outer.nesterov()``; LocalSGD and DDP: averaging). As in a
config, a preset only fills what you leave unset: any dial passed explicitly wins
(``DiLoCo(..., batch=AdaptiveBatch("norm"))`` is DiLoCo with the norm test).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from adloco.library.comm.base import Comm
from adloco.library.method import AdLoCo, spell_out
from adloco.library.options import RoundOptions
from adloco.library.presets import PRESETS, preset
from adloco.library.replica import LossFn
from adloco.library.settings import AdaptiveBatch


class DiLoCo(AdLoCo):
    """DiLoCo (Douillard et al. 2023): H local steps, then an outer step on the averaged pseudo-gradient
    (the preset's SGD at lr 0.5; the paper's Nesterov is ``outer=Outer.nesterov()``); constant batch, one
    trainer (or K independent ones), no merging (ALGORITHM.md §6).

    Its arguments are ``AdLoCo``'s and ``batch_size``; the dials it leaves unset are its method's preset
    (:meth:`adloco.library.options.RoundOptions.for_method`: ``trainers`` 1, a constant batch, no merging, its
    outer step). A dial passed explicitly wins over the preset.

    Args:
        model: this process's worker replica(s), as :class:`~adloco.library.method.AdLoCo` takes them.
        inner_optimizer: the optimizer of each replica.
        batch_size: the rows of every worker's inner step (default: the ``batch`` section's initial
            request, 4; or give a whole ``batch=AdaptiveBatch(...)``, not both). In the hooked form
            (``with algo:``) your loader decides the rows: pass ``batch_size``, or ``totals.examples`` is
            None (unknown) rather than a number adloco never saw.
        comm: the communicator, as :class:`~adloco.library.method.AdLoCo` takes it.
        loss_fn: ``loss_fn(model, batch)`` -> the mean loss over the batch's rows.
        options: the round's dials as one :class:`~adloco.library.options.RoundOptions`; or give its fields as
            keywords, as the signature lists them, not both.
    """

    METHOD: ClassVar[str] = "diloco"

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        inner_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        *,
        batch_size: int | None = None,
        comm: Comm | None = None,
        loss_fn: LossFn | None = None,
        options: RoundOptions | None = None,
        **dials: Any,
    ) -> None:
        o = RoundOptions.given(options, dials, type(self).__name__)
        if batch_size is not None:
            if o.batch is not None:
                raise ValueError("batch_size: give batch_size or batch=AdaptiveBatch(...), not both")
            if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
                raise ValueError(f"batch_size = {batch_size!r}: must be an integer >= 1")
            batch = preset(
                self.METHOD, AdaptiveBatch, initial=batch_size, max=max(batch_size, AdaptiveBatch().max)
            )
            o = o.replace(batch=batch)
        super().__init__(model, inner_optimizer, comm=comm, loss_fn=loss_fn, options=o)
        self.stated_batch = batch_size


class LocalSGD(DiLoCo):
    """LocalSGD (Stich 2019): local steps, then the workers' parameters averaged (outer ``average``).
    Give it a plain ``torch.optim.SGD`` as inner optimizer to match the paper. The arguments are
    :class:`DiLoCo`'s."""

    METHOD: ClassVar[str] = "localsgd"


class DDP(DiLoCo):
    """Synchronous data parallel: gradients averaged every step, so the workers stay identical; a round
    is only a reporting period of ``inner_steps`` steps. The arguments are :class:`DiLoCo`'s (the outer
    step averages; nothing travels behind compute)."""

    METHOD: ClassVar[str] = "ddp"
    ddp = True


for _cls in (DiLoCo, LocalSGD, DDP):
    spell_out(_cls)

METHOD_CLASSES: dict[str, type[AdLoCo]] = {
    "adloco": AdLoCo,
    "diloco": DiLoCo,
    "localsgd": LocalSGD,
    "ddp": DDP,
}
assert set(METHOD_CLASSES) == set(PRESETS)
