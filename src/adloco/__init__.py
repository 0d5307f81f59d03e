"""adloco: low-communication distributed training with AdLoCo, DiLoCo, LocalSGD and DDP.

    from adloco import DiLoCo, AdLoCo, Outer, AdaptiveBatch, Merging, Switch, Wire, Sync

Build an algorithm object from your model and inner optimizer, then either let it run each inner step
(``algo.step(batch)``, which AdLoCo's batch test needs) or hook your optimizer (``with algo:``). See
:mod:`adloco.method`. Names load on first use, so ``adloco --help`` does not wait for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "AdLoCo": "adloco.method",
    "DiLoCo": "adloco.baselines",
    "LocalSGD": "adloco.baselines",
    "DDP": "adloco.baselines",
    "RoundAborted": "adloco.method",
    "RoundOptions": "adloco.options",
    "RoundReport": "adloco.round",
    "WorkerPlan": "adloco.round",
    "AdaptiveBatch": "adloco.settings",
    "Merging": "adloco.settings",
    "Outer": "adloco.settings",
    "OuterParams": "adloco.algorithms.outer",
    "Switch": "adloco.settings",
    "Wire": "adloco.settings",
    "Sync": "adloco.settings",
    "InProcessComm": "adloco.comm",
    "ThreadComm": "adloco.comm",
    "TorchDistComm": "adloco.comm",
    "Hub": "adloco.comm",
    "simulate": "adloco.plan.sim",
    "Setup": "adloco.plan.sim",
    "Simulation": "adloco.plan.sim",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'adloco' has no attribute {name!r}")
