"""The inner optimizer of a worker and its learning-rate schedule (ALGORITHM.md §1, step 2)."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, cast

import torch

from adloco.config import InnerConfig
from adloco.library.comm.base import Comm
from adloco.library.flat import FlatModule
from adloco.library.optim import muon_adamw, ns_dtype_for

Chosen = Literal["adamw", "muon"]  # what inner.optimizer auto becomes


def auto_optimizer(device_types: list[str], task: str = "causal_lm") -> Chosen:
    """What ``inner.optimizer: auto`` runs for a model of ``task`` where processes compute on
    ``device_types``: Muon for a language model where every one is a CPU, where it was measured ahead of
    AdamW per second (benchmarks/RESULTS.md, "Muon on the demo, per second", and the 11M runs priced by
    their step profiles); AdamW where any is a GPU, where Muon's step inside the CUDA graphs is not yet timed
    (RESULTS.md states the test that would change it), and for a classifier, where Muon is not measured
    (and left a small BERT at chance where AdamW learned the task, tests/e2e/test_classification.py)."""
    cpus = bool(device_types) and all(t == "cpu" for t in device_types)
    return "muon" if cpus and task == "causal_lm" else "adamw"


def agreed_inner(
    cfg: InnerConfig, comm: Comm, device_type: str, resumed: str | None = None, task: str = "causal_lm"
) -> InnerConfig:
    """``cfg`` with its ``auto`` choices resolved once for the whole run, agreed by every process.
    ``optimizer: auto``: the optimizer the checkpoint's run chose (``resumed``, where a process has one: a
    run goes on with the optimizer whose state it holds, on whatever device), else :func:`auto_optimizer` of
    every process's device for a model of ``task``. ``muon_ns_dtype: auto``: float32 where any process's
    device emulates bfloat16 (that process's steps would be several times slower, and replicas that must
    agree would round apart), else bfloat16. Any other ``cfg`` as it is."""
    if cfg.optimizer == "auto":
        every = [cast("list[str | None]", x) for x in comm.all_gather_json([device_type, resumed])]
        kept = [cast("Chosen", r) for _, r in every if r]
        chosen = kept[0] if kept else auto_optimizer([str(t) for t, _ in every], task)
        cfg = dataclasses.replace(cfg, optimizer=chosen)
    if cfg.optimizer != "muon" or cfg.muon_ns_dtype != "auto":
        return cfg
    every_dtype = comm.all_gather_json(ns_dtype_for("auto", device_type))
    return dataclasses.replace(cfg, muon_ns_dtype="float32" if "float32" in every_dtype else "bfloat16")


def local_inner(cfg: InnerConfig, device_type: str, task: str = "causal_lm") -> InnerConfig:
    """``cfg`` with ``optimizer: auto`` resolved for one process on ``device_type`` and a model of ``task``
    (``adloco profile``, which times a worker's step as a run here would take it; :func:`make_optimizer`
    given ``auto``)."""
    if cfg.optimizer != "auto":
        return cfg
    return dataclasses.replace(cfg, optimizer=auto_optimizer([device_type], task))


def make_optimizer(flat: FlatModule, cfg: InnerConfig, capturable: bool = False) -> torch.optim.Optimizer:
    """The inner optimizer on the flat buffer's two groups (matrices with weight decay, the rest without).
    ``capturable``: one that steps inside a CUDA graph (``runtime.cuda_graphs``): AdamW with its step
    counts on the device and the fused kernel, SGD fused (both take their lr as a device tensor).

    ``muon`` needs matrices: Muon on the model's own hidden matrices (views of the flat buffer, shaped) and
    AdamW on the rest, as one optimizer (:func:`adloco.library.optim.muon_adamw`; captured with the AdamW
    part as above, Muon taking its lr as a device tensor). On a sharded worker the matrices are the
    module's DTensors (:class:`adloco.library.optim.Muon`)."""
    if cfg.optimizer == "auto":  # one process's own choice, by its parameters' device (a run agrees first)
        cfg = local_inner(cfg, flat.param.device.type)
    if cfg.optimizer == "muon":
        return muon_adamw(
            flat.module,
            cfg.lr,
            weight_decay=cfg.weight_decay,
            betas=(cfg.betas[0], cfg.betas[1]),
            momentum=cfg.muon_momentum,
            lr_ratio=cfg.muon_lr_ratio,
            adjust_lr=cfg.muon_adjust_lr,
            ns_dtype=cfg.muon_ns_dtype,
            capturable=capturable,
        )
    groups = [
        {"params": [p], "weight_decay": cfg.weight_decay if decay else 0.0}
        for p, decay in zip(flat.groups, flat.decay_flags, strict=True)
    ]
    graph: dict[str, bool] = {"fused": True} if capturable else {}
    if cfg.optimizer == "adamw":
        if capturable:
            graph["capturable"] = True
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.betas[0], cfg.betas[1]), **graph)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, **graph)


def lr_at(step: float, total: int, cfg: InnerConfig) -> float:
    """Linear warmup over ``warmup_fraction`` of ``total`` steps, then cosine (or constant). ``step`` may be
    fractional: the driver passes examples seen in units of a step at the initial request
    (ALGORITHM.md §10), which is the step index itself for a constant batch."""
    warmup = int(cfg.warmup_fraction * total)
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    if cfg.schedule == "constant" or total <= warmup:
        return cfg.lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
