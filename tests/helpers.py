"""Shared test helpers: synthetic token data, tiny models, a coordinator on the in-process backend."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from adloco import models
from adloco.config import Config, resolve
from adloco.data.tokens import LMData
from adloco.engine.backends.inprocess import InProcessComm
from adloco.engine.coordinator import Coordinator

VOCAB = 64


def synthetic_data(
    seq_len: int = 8, n_train_blocks: int = 400, n_val_blocks: int = 8, seed: int = 0
) -> LMData:
    """Token streams with some structure (a noisy counter) so that a model can learn something."""
    rng = np.random.default_rng(seed)

    def stream(n: int) -> np.ndarray:
        base = np.arange(n) % (VOCAB - 1) + 1
        noise = rng.integers(1, VOCAB, size=n)
        keep = rng.random(n) < 0.8
        return np.where(keep, base, noise).astype(np.uint16)

    meta = {"eos_id": 0, "pad_id": 0, "vocab_size": VOCAB, "max_token_id": VOCAB - 1, "documents": [1, 1]}
    return LMData(stream(n_train_blocks * seq_len), stream(n_val_blocks * seq_len), None, seq_len, meta)


def tiny_config(*overrides: str, **sections: dict[str, Any]) -> Config:
    base = {
        "model": {"name": "llama-micro"},
        "data": {"seq_len": 8},
        "algorithm": {"rounds": 3, "inner_steps": 2, "workers": 4, "trainers": 4},
        "batch": {"initial": 2, "max": 16},
        "switch": {"b_max": 4},
        "merge": {"every": 1},
        "eval": {"max_examples": 4, "batch_size": 4},
        "logging": {"progress": "off"},
    }
    for section, values in sections.items():
        base.setdefault(section, {}).update(values)
    return resolve(base=base, overrides=list(overrides))


def build_fn(data: LMData, cfg: Config) -> models.ModelFactory:
    return models.ModelFactory(cfg.model, data.vocab_size, cfg.data.seq_len, data.eos_id, data.pad_id)


def coordinator(cfg: Config, data: LMData | None = None) -> Coordinator:
    data = data or synthetic_data(seq_len=cfg.data.seq_len)
    return Coordinator(
        cfg,
        InProcessComm(cfg.algorithm.workers),
        data,
        build_fn(data, cfg),
        torch.device("cpu"),
        log=lambda s: None,
    )
