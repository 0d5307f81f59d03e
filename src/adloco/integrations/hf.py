"""A ``transformers.TrainerCallback`` that trains with an adloco algorithm under an unmodified ``Trainer``.

    from adloco import DiLoCo
    from adloco.integrations.hf import AdLoCoCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[AdLoCoCallback(lambda model, opt: DiLoCo(model, opt, inner_steps=20))])
    trainer.train()                               # or train(resume_from_checkpoint=True)

How it plugs in (written against transformers 5.x and accelerate 1.x):

* At ``on_train_begin`` (after the Trainer has built its optimizer, prepared it with accelerate and, on a
  resume, loaded its checkpoint) the callback builds the algorithm with your ``build(model, optimizer)``
  over the Trainer's model and the torch optimizer inside accelerate's ``AcceleratedOptimizer``, and
  enters its hooked form (``with algo:``, :mod:`adloco.library.hooked`): the hooks fire inside the Trainer's
  ``optimizer.step()``, once per optimizer step (after the last micro-batch of gradient accumulation,
  after clipping, before the scheduler step), so H counts the Trainer's optimizer steps. ``on_train_end``
  leaves it.
* Under torchrun, accelerate runs as it always does: it joins the process group (which the algorithm's
  default communicator then uses), shards the data by process, and wraps the model in
  DistributedDataParallel. The callback switches that wrapper's gradient all-reduce off
  (``require_backward_grad_sync``): every worker takes its inner steps on its own data and gradients, and
  the algorithm alone communicates, every H steps. ``average_tokens_across_devices`` must be False there
  (the Trainer would otherwise all-gather token counts at every step and weight each worker's loss by
  the others').
* Checkpoints are the Trainer's own: at ``on_save`` every process writes the algorithm's state
  (:meth:`~adloco.library.state.AlgorithmState.state_dict`: outer optimizer, θ, its worker's inner optimizer and
  counters) as ``adloco-state-<rank>.pt`` into the checkpoint folder the Trainer just wrote, and
  ``train(resume_from_checkpoint=...)`` loads it back at ``on_train_begin``, after the Trainer restored
  its own state, so the run continues bit for bit. Checkpoints must fall between rounds: ``save_steps``
  a multiple of H.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from adloco.integrations._common import STATE_FILE, Build, build, checked, no_gradient_sync, round_boundary
from adloco.library.method import AdLoCo

__all__ = ["AdLoCoCallback"]


class AdLoCoCallback(TrainerCallback):
    """Runs the Trainer's optimizer steps under an adloco algorithm, and keeps its state in the Trainer's
    checkpoints.

    Args:
        build: ``build(model, optimizer)`` -> the algorithm (``DiLoCo``, ``LocalSGD``, or ``AdLoCo`` without
            the batch test), over the model and optimizer it is given: called once per ``train()``, at its
            start, on every process (its constructor is a collective). Give it ``comm=`` for workers in
            threads; by default it uses torch.distributed's group (torchrun) or runs alone.

    ``algo`` is the algorithm of the last ``train()`` (None before): its ``round``, ``totals`` and
    ``last_report`` say what it did.
    """

    def __init__(self, build: Build) -> None:
        self.build = checked(build, "model")
        self.algo: AdLoCo | None = None
        self._undo: Callable[[], None] | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        model, stepped = kw.get("model"), kw.get("optimizer")
        opt = getattr(stepped, "optimizer", stepped)  # accelerate's AcceleratedOptimizer wraps the torch one
        if not isinstance(opt, torch.optim.Optimizer) or model is None:
            raise ValueError("AdLoCoCallback: the Trainer passed no model or optimizer to on_train_begin")
        distributed = args.world_size > 1
        if distributed and args.average_tokens_across_devices:
            raise ValueError(
                "TrainingArguments.average_tokens_across_devices = True: under several processes the Trainer "
                "would all-gather token counts at every step and weight each worker's loss by the others'; "
                "set it to False (each worker's inner steps use its own mean loss)"
            )
        self.algo = algo = build(self.build, model, opt, "AdLoCoCallback")
        save_every = _save_steps(args, state)
        if save_every is not None and save_every % algo.H:
            raise ValueError(
                f"TrainingArguments.save_steps = {save_every}: not a multiple of inner_steps {algo.H}; "
                "checkpoints must fall between rounds"
            )
        if state.max_steps % algo.H:
            raise ValueError(
                f"max_steps {state.max_steps}: not a multiple of inner_steps {algo.H} (training must end on a "
                "synchronization)"
            )
        if state.global_step > 0:  # resumed: the Trainer has restored its own state; now the algorithm's
            path = os.path.join(
                _checkpoint_dir(args, state.global_step), STATE_FILE.format(rank=algo.view.rank)
            )
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{path}: resuming at step {state.global_step}, but the checkpoint holds no adloco state "
                    "for this process (saved without AdLoCoCallback, or resumed from outside output_dir)"
                )
            algo.load_state_dict(torch.load(path, map_location=algo.view.device, weights_only=True))
        if distributed:
            self._undo = no_gradient_sync(model)
        algo.__enter__()

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        algo = self.algo
        assert algo is not None
        round_boundary(algo, state.global_step, "AdLoCoCallback")
        folder = _checkpoint_dir(args, state.global_step)
        os.makedirs(folder, exist_ok=True)  # written by process 0; another may get here first
        path = os.path.join(folder, STATE_FILE.format(rank=algo.view.rank))
        tmp = f"{path}.tmp"
        torch.save(algo.state_dict(), tmp)
        os.replace(tmp, path)  # whole, or not there

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.algo is not None:
            self.algo.__exit__(None, None, None)
        if self._undo is not None:
            self._undo()
            self._undo = None


def _checkpoint_dir(args: TrainingArguments, step: int) -> str:
    """Where the Trainer writes the checkpoint of ``step`` (``Trainer._save_checkpoint``)."""
    return os.path.join(args.output_dir or "", f"{PREFIX_CHECKPOINT_DIR}-{step}")


def _save_steps(args: TrainingArguments, state: TrainerState) -> int | None:
    """Optimizer steps between checkpoints with ``save_strategy="steps"`` (None otherwise); the Trainer
    has already turned a fraction of max_steps into steps (``state.save_steps``)."""
    if str(getattr(args.save_strategy, "value", args.save_strategy)) != "steps":
        return None
    return int(state.save_steps) if state.save_steps else None
