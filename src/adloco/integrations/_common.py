"""What the trainer callbacks share: building the algorithm, checking it suits the hooked form, and
switching DistributedDataParallel's gradient all-reduce off."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from adloco.library.method import AdLoCo

Build = Callable[[nn.Module, torch.optim.Optimizer], AdLoCo]
STATE_FILE = "adloco-state-{rank}.pt"  # one per process, beside the trainer's own checkpoint files


def checked(make: Build, takes: str) -> Build:
    """``make``, refused with a TypeError unless it is a function (``takes``: what the trainer calls the
    model it passes, ``model`` or ``module``)."""
    if not callable(make):
        raise TypeError(
            f"build: a function ({takes}, optimizer) -> algorithm, e.g. lambda m, o: DiLoCo(m, o, inner_steps=20)"
        )
    return make


def build(make: Build, model: nn.Module, optimizer: torch.optim.Optimizer, where: str) -> AdLoCo:
    """``make(model, optimizer)``, checked: an algorithm object over exactly this model and optimizer, in
    the hooked form's reach (one worker per process; not DDP, whose averaging the trainer does itself)."""
    algo = make(model, optimizer)
    if not isinstance(algo, AdLoCo):
        raise TypeError(
            f"{where}: build(model, optimizer) returned {type(algo).__name__}; it must return an adloco "
            "algorithm (DiLoCo, LocalSGD or AdLoCo)"
        )
    view = algo.view
    if len(view.workers) != 1:
        raise ValueError(
            f"{where}: the algorithm hosts {len(view.workers)} workers in this process; a trainer is one "
            "worker: run one process per worker (torchrun), or one trainer per thread (ThreadComm)"
        )
    rep = view.first
    if rep.model is not model or rep.optimizer is not optimizer:
        raise ValueError(
            f"{where}: build(model, optimizer) must build the algorithm over the model and optimizer it is "
            "given (those the trainer steps)"
        )
    if view.ddp:
        raise ValueError(
            f"{where}: DDP averages gradients before the trainer's step, which the trainer's own "
            "distributed data parallel already does: use the trainer's, or DiLoCo / LocalSGD / AdLoCo"
        )
    return algo


def round_boundary(algo: AdLoCo, step: int, where: str) -> None:
    """An algorithm's state is taken between rounds only (:meth:`adloco.library.state.AlgorithmState.state_dict`).
    ``step``: the trainer's optimizer steps, which began on a round's boundary (a start, or a resume of
    a checkpoint taken on one); the hooked form synchronizes every H of them."""
    if step % algo.H:
        raise ValueError(
            f"{where}: a checkpoint at optimizer step {step}, {step % algo.H} step(s) into a round of "
            f"{algo.H}: save every multiple of inner_steps ({algo.H}) steps, so that checkpoints fall "
            "between rounds"
        )


def no_gradient_sync(model: nn.Module) -> Callable[[], None]:
    """Switch off the gradient all-reduce of the DistributedDataParallel that will wrap ``model`` (the
    trainer's, under torchrun): each worker then steps on its own gradients, as DiLoCo's inner steps must,
    and the algorithm alone communicates. DDP's own switch for that is ``require_backward_grad_sync``
    (what ``no_sync()`` sets for one step; here it stays off, and with it DDP's buffer broadcast). The
    wrapper is found at its first forward through a global forward pre-hook, removed there; the returned
    function removes it when no forward came."""
    from torch.nn.parallel import DistributedDataParallel

    handle: Any = None

    def hook(module: nn.Module, args: Any) -> None:
        if isinstance(module, DistributedDataParallel) and module.module is model:
            module.require_backward_grad_sync = False
            handle.remove()

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    return handle.remove
