"""A PyTorch Lightning ``Callback`` that trains with an adloco algorithm under an unmodified ``Trainer``
(``pip install 'adloco[lightning]'``).

    from adloco import DiLoCo
    from adloco.integrations.lightning import AdLoCoCallback

    trainer = L.Trainer(max_steps=120, callbacks=[AdLoCoCallback(lambda m, o: DiLoCo(m, o, inner_steps=20))])
    trainer.fit(module, loader)                   # or fit(..., ckpt_path=...) to resume

How it plugs in (written against Lightning 2.x; the class is a ``Callback`` of both ``lightning.pytorch``
and ``pytorch_lightning``, whichever is installed, or both):

* At ``on_train_start`` (after the strategy set up the optimizer and wrapped the module and, on a
  resume, restored the checkpoint) the callback builds the algorithm with your ``build(module,
  optimizer)`` over the LightningModule and its one optimizer, and enters the hooked form (``with algo:``,
  :mod:`adloco.library.hooked`): the hooks fire inside the optimizer's ``step`` that Lightning calls once per
  optimizer step (after gradient accumulation and clipping), so H counts Lightning's optimizer steps.
  ``on_train_end`` leaves it.
* Under torchrun with ``strategy="ddp"``, Lightning joins the process group (the algorithm's default
  communicator uses it), gives each process its own shard of the data (``DistributedSampler``) and wraps
  the module in DistributedDataParallel; the callback switches that wrapper's gradient all-reduce off
  (``require_backward_grad_sync``, what ``no_sync()`` sets), so the algorithm alone communicates.
* Checkpoints are Lightning's own: the callback's :meth:`state_dict` is every process's algorithm state
  (:meth:`~adloco.library.state.AlgorithmState.state_dict`: outer optimizer, θ, its worker's inner optimizer and
  counters), gathered to process 0, which writes the checkpoint; ``fit(ckpt_path=...)`` hands each
  process its own part back, applied at ``on_train_start`` after Lightning restored the module and
  optimizer, so the run continues bit for bit. A checkpoint holds one part per process (process 0 holds
  them all while it saves), and must fall between rounds: save every multiple of H steps.
"""

from __future__ import annotations

from typing import Any

from adloco.integrations._common import Build, build, checked, round_boundary
from adloco.library.method import AdLoCo

_BASES: list[type] = []
try:
    import lightning.pytorch as _lightning

    _BASES.append(_lightning.Callback)
except ImportError:
    pass
try:
    import pytorch_lightning as _pytorch_lightning

    _BASES.append(_pytorch_lightning.Callback)
except ImportError:
    pass
if not _BASES:
    raise ImportError(
        "adloco.integrations.lightning needs PyTorch Lightning: pip install 'adloco[lightning]' "
        "(or pip install lightning)"
    )

__all__ = ["AdLoCoCallback"]


class AdLoCoCallback(*_BASES):  # type: ignore[misc]
    """Runs Lightning's optimizer steps under an adloco algorithm, and keeps its state in Lightning's
    checkpoints.

    Args:
        build: ``build(module, optimizer)`` -> the algorithm (``DiLoCo``, ``LocalSGD``, or ``AdLoCo``
            without the batch test), over the LightningModule and optimizer it is given: called at each
            ``fit``'s start, on every process (its constructor is a collective). By default it uses
            torch.distributed's group (torchrun, ``strategy="ddp"``) or runs alone.

    ``algo`` is the algorithm of the last ``fit`` (None before): its ``round``, ``totals`` and
    ``last_report`` say what it did.
    """

    def __init__(self, build: Build) -> None:
        self.build = checked(build, "module")
        self.algo: AdLoCo | None = None
        self._trainer: Any = None
        self._loaded: dict[str, Any] | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        where = "AdLoCoCallback"
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"{where}: configure_optimizers returned {len(trainer.optimizers)} optimizers; the algorithm "
                "hooks one, over all the module's parameters"
            )
        self._trainer = trainer
        self.algo = algo = build(self.build, pl_module, trainer.optimizers[0], where)
        steps = trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
        if steps % algo.H:
            raise ValueError(
                f"max_steps {steps}: not a multiple of inner_steps {algo.H} (training must end on a "
                "synchronization)"
            )
        if self._loaded is not None:
            states, world = self._loaded["states"], trainer.world_size
            if len(states) != world:
                raise ValueError(
                    f"checkpoint: written by {len(states)} process(es); resume it with as many (this run has {world})"
                )
            algo.load_state_dict(states[trainer.global_rank])
            self._loaded = None
        from torch.nn.parallel import DistributedDataParallel

        wrapped = trainer.strategy.model
        if isinstance(wrapped, DistributedDataParallel):
            wrapped.require_backward_grad_sync = False  # the algorithm alone communicates
        algo.__enter__()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.algo is not None:
            self.algo.__exit__(None, None, None)

    def state_dict(self) -> dict[str, Any]:
        """Every process's algorithm state, gathered to process 0 (the one that writes the checkpoint);
        empty before training starts."""
        algo, trainer = self.algo, self._trainer
        if algo is None or trainer is None:
            return {}
        round_boundary(algo, trainer.global_step, "AdLoCoCallback")
        mine = algo.state_dict()
        if trainer.world_size == 1:
            return {"states": [mine]}
        import torch.distributed as dist

        parts: list[Any] | None = [None] * trainer.world_size if trainer.global_rank == 0 else None
        dist.gather_object(mine, parts, dst=0)
        return {"states": parts} if parts is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the checkpoint's parts until ``on_train_start``, which applies this process's once the
        algorithm is built and Lightning has restored the module and optimizer."""
        self._loaded = dict(state_dict) if state_dict else None
