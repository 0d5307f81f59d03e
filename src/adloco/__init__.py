"""adloco: low-communication distributed training with AdLoCo, DiLoCo, LocalSGD and DDP.

    from adloco import DiLoCo, AdLoCo, Outer, AdaptiveBatch, Merging, Switch, Wire, Sync

Build an algorithm object from your model and inner optimizer, then either let it run each inner step
(``algo.step(batch)``, which AdLoCo's batch test needs) or hook your optimizer (``with algo:``). See
:mod:`adloco.library.method`. Names load on first use, so ``adloco --help`` does not wait for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "AdLoCo": "adloco.library.method",
    "DiLoCo": "adloco.library.baselines",
    "LocalSGD": "adloco.library.baselines",
    "DDP": "adloco.library.baselines",
    "RoundAborted": "adloco.library.method",
    "RoundOptions": "adloco.library.options",
    "RoundReport": "adloco.library.round",
    "WorkerPlan": "adloco.library.round",
    "AdaptiveBatch": "adloco.library.settings",
    "Merging": "adloco.library.settings",
    "Outer": "adloco.library.settings",
    "OuterParams": "adloco.library.algorithms.outer",
    "Switch": "adloco.library.settings",
    "Wire": "adloco.library.settings",
    "Sync": "adloco.library.settings",
    "InProcessComm": "adloco.library.comm",
    "ThreadComm": "adloco.library.comm",
    "TorchDistComm": "adloco.library.comm",
    "Hub": "adloco.library.comm",
    "simulate": "adloco.plan.sim",
    "Setup": "adloco.plan.sim",
    "Simulation": "adloco.plan.sim",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'adloco' has no attribute {name!r}")
