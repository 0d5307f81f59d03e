"""The models of ``adloco train``: presets and checkpoints built into replicas (:mod:`.factory`, the only
module that builds transformers model classes), their shapes and memory (:mod:`.sizing`), access to the
Hugging Face hub (:mod:`.hub`), and the final model's folder written a file at a time (:mod:`.export`).
Names load on first use: ``adloco.config`` reads the shapes without importing the factory."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ModelFactory": "adloco.models.factory",
    "MODEL_HINT": "adloco.models.factory",
    "count_parameters": "adloco.models.factory",
    "factory_for": "adloco.models.factory",
    "output_layer": "adloco.models.factory",
    "shard": "adloco.models.factory",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'adloco.models' has no attribute {name!r}")
