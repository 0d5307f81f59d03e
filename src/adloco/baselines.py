"""DiLoCo, LocalSGD and DDP: :class:`adloco.method.AdLoCo` with parts turned off, as named methods.

Each takes its defaults from the method presets of :data:`adloco.settings.PRESETS`, the table
``adloco train``'s ``algorithm.method`` reads: one trainer, a constant batch (never capped to b_max), no
merging, and its outer step (DiLoCo: Nesterov with the ``outer`` section's lr 0.7 and momentum 0.9, SGD
at lr 0.7 with ``wire=Wire(overlap="delayed")``, ALGORITHM.md §13; LocalSGD and DDP: averaging). As in a
config, a preset only fills what you leave unset: any dial passed explicitly wins
(``DiLoCo(..., batch=AdaptiveBatch("norm"))`` is DiLoCo with the norm test).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from adloco.comm.base import Comm
from adloco.method import AdLoCo
from adloco.replica import LossFn
from adloco.settings import (
    PRESETS,
    AdaptiveBatch,
    Balance,
    InnerState,
    Merging,
    OnResize,
    Outer,
    Precision,
    Switch,
    Wire,
    outer_note,
    preset,
)

log = logging.getLogger(__name__)


class DiLoCo(AdLoCo):
    """DiLoCo (Douillard et al. 2023): H local steps, then an outer Nesterov step on the averaged
    pseudo-gradient; constant batch, one trainer (or K independent ones), no merging (ALGORITHM.md §6).

    Every argument but ``batch_size`` is ``AdLoCo``'s, with the same default where the method does not
    set its own (``trainers``: 1; the dials: the method's preset). A dial passed explicitly wins over the
    preset; a keyword that is none of these is Python's ``TypeError``.

    Args:
        model: this process's worker replica(s): one ``nn.Module``, or a list for several workers in one
            process. Parameters must be float32; they move into a flat buffer (the objects stay).
        inner_optimizer: the optimizer of each replica (any ``torch.optim.Optimizer`` over all its
            parameters); its state persists across rounds.
        inner_steps: H, optimizer steps per round (DDP: a reporting period only; gradients are averaged
            every step).
        batch_size: the rows of every worker's inner step (default: the ``batch`` section's initial
            request, 4; or give a whole ``batch=AdaptiveBatch(...)``, not both). In the hooked form
            (``with algo:``) your loader decides the rows: pass ``batch_size``, or ``totals.examples`` is
            None (unknown) rather than a number adloco never saw.
        trainers: independent model instances, each with at least one worker (1: one model of all the
            workers).
        comm: the communicator; default: torch.distributed's default group when it is initialized
            (``TorchDistComm``), else all workers in this process (``InProcessComm``). Under a launcher
            of several processes (``WORLD_SIZE`` > 1) with no process group, a ``ValueError`` says to call
            ``torch.distributed.init_process_group()`` or pass ``comm``.
        loss_fn: ``loss_fn(model, batch)`` -> the mean loss over the batch's rows; default
            ``model(**batch).loss``.
        outer: the outer step (None: DiLoCo's Nesterov, lr 0.7, momentum 0.9; with a codec that brings its
            own step, that one (topk: SparseLoCo's SGD at lr 1, no momentum), or under ``comm.overlap``
            delayed SGD at lr 0.7, since a momentum fed Δ one round stale diverges (ALGORITHM.md §13), each
            said in one log line; LocalSGD's and DDP's average).
        batch: the batch dial (None: a constant batch, no test, no statistics).
        merge: merging (None: none).
        switch: switch mode (None: ``accumulate``, so a constant batch is honoured and never capped to
            b_max); ``switch.b_max`` is every local worker's largest micro-batch.
        wire: how Δ travels (the ``comm`` section: dtype, blocks, error feedback, overlap, fragments);
            None: float32, nothing behind compute.
        clip: inner gradient clipping (global norm; 0 turns it off).
        precision: fp32, or bf16 / fp16 autocast on CUDA (fp16 with dynamic loss scaling).
        inner_state: keep (DiLoCo) or reset the inner optimizer every round.
        balance: equal gives every worker its request (bit for bit reproducible); speed shares a
            trainer's examples among its workers by their measured speed (ALGORITHM.md §9.3).
        fixed_rows: a forward and backward pass's fixed cost, in rows (α/β of a step-time profile,
            ALGORITHM.md §11); used by balance speed.
        emulate_speed: one factor in (0, 1] per worker: worker w takes 1/s_w as long per step.
        on_resize: loading the state of a run with another number of workers (ALGORITHM.md §9.2):
            per_trainer keeps each trainer's examples per step, per_worker keeps b.
        snapshot: keep the inner state at each round's start in host memory, so an aborted round is
            undone in place.
        sync_initial: broadcast each trainer's θ from its first worker to the others at construction;
            pass False when every process built identical replicas.
        cuda_graphs: each worker's inner step a CUDA graph replayed on its own stream (workers of a
            process train at once on their GPU); needs a capturable inner optimizer; not for DDP.
    """

    METHOD: ClassVar[str] = "diloco"

    def __init__(
        self,
        model: nn.Module | Sequence[nn.Module],
        inner_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        *,
        inner_steps: int = 12,
        batch_size: int | None = None,
        trainers: int = 1,
        comm: Comm | None = None,
        loss_fn: LossFn | None = None,
        outer: Outer | None = None,
        batch: AdaptiveBatch | None = None,
        merge: Merging | None = None,
        switch: Switch | None = None,
        wire: Wire | None = None,
        clip: float = 1.0,
        precision: Precision = "fp32",
        inner_state: InnerState = "keep",
        balance: Balance = "equal",
        fixed_rows: float = 0.0,
        emulate_speed: Sequence[float] | None = None,
        on_resize: OnResize = "per_trainer",
        snapshot: bool = False,
        sync_initial: bool = True,
        cuda_graphs: bool = False,
    ) -> None:
        m = self.METHOD
        if batch_size is not None:
            if batch is not None:
                raise ValueError("batch_size: give batch_size or batch=AdaptiveBatch(...), not both")
            if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
                raise ValueError(f"batch_size = {batch_size!r}: must be an integer >= 1")
            batch = preset(m, AdaptiveBatch, initial=batch_size, max=max(batch_size, AdaptiveBatch().max))
        if outer is None:  # the preset's; a codec's own step, or under delayed a staleness-aware one
            w = wire if wire is not None else Wire()
            outer = preset(m, Outer, w.overlap, w.dtype)
            if (note := outer_note(m, outer, w)) is not None:
                log.info(note)
        super().__init__(
            model,
            inner_optimizer,
            inner_steps=inner_steps,
            trainers=trainers,
            comm=comm,
            loss_fn=loss_fn,
            outer=outer,
            batch=batch if batch is not None else preset(m, AdaptiveBatch),
            merge=merge if merge is not None else preset(m, Merging),
            switch=switch if switch is not None else preset(m, Switch),
            wire=wire,
            clip=clip,
            precision=precision,
            inner_state=inner_state,
            balance=balance,
            fixed_rows=fixed_rows,
            emulate_speed=emulate_speed,
            on_resize=on_resize,
            snapshot=snapshot,
            sync_initial=sync_initial,
            cuda_graphs=cuda_graphs,
        )
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


METHOD_CLASSES: dict[str, type[AdLoCo]] = {
    "adloco": AdLoCo,
    "diloco": DiLoCo,
    "localsgd": LocalSGD,
    "ddp": DDP,
}
assert set(METHOD_CLASSES) == set(PRESETS)
