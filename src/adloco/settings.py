"""The dials of the algorithm objects, as small frozen dataclasses checked at construction.

Each mirrors one section of ``adloco train``'s config (``batch``, ``merge``, ``switch``, ``outer``) and
cites the section of ALGORITHM.md it parametrizes. A bad value raises ``ValueError`` naming the argument, the value
and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

TESTS = ("norm", "inner_product", "augmented_inner_product", "none")
ESTIMATORS = ("pooled", "paper")
FORMULAS = ("spec", "reference")
POLICIES = ("smallest", "largest_with_smallest", "none")
SURVIVOR = ("max", "own")
ALLOCATIONS = ("requests", "demand")
MODES = ("threshold", "accumulate", "cap")
SCHEDULES = ("fixed", "reference")
OUTERS = ("average", "sgd", "nesterov")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not one of {' | '.join(allowed)}")


def _positive(name: str, value: float, *, integer: bool = False, zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if zero else value > 0)
    if integer:
        ok = ok and float(value).is_integer()
    if not ok:
        kind = "an integer" if integer else "a finite number"
        raise ValueError(f"{name}: {value!r} must be {kind} {'>= 0' if zero else '> 0'}")


@dataclass(frozen=True)
class AdaptiveBatch:
    """The batch test that grows each trainer's request b (ALGORITHM.md §2).

    ``test``: norm (η) | inner_product (ϑ) | augmented_inner_product (ϑ and ν) | none (constant b).
    ``estimator``: pooled chunk gradients at the round's common point, or paper (each worker's last
    gradient, the reference's; needs two or more workers per trainer). ``statistics``: probe even when
    ``test`` is none (to log them). ``exact_mean``: the norm test all-reduces the mean probe gradient
    (P values) instead of sending scalars only. ``formula``: ``spec``, the inner-product tests as
    ALGORITHM.md §2.2–2.4 writes them, or ``reference``, as the reference implementation computed them (ν
    in both parts, no c and no 1/M, a per-entry variance of the orthogonal parts; ALGORITHM.md §9.1), for
    reproducing the paper's setting.
    """

    test: str = "norm"
    initial: int = 4
    max: int = 32
    eta: float = 0.65
    vartheta: float = 0.01
    nu: float = 0.3
    estimator: str = "pooled"
    probe_chunks: int = 8
    statistics: bool = True
    exact_mean: bool = False
    formula: str = "spec"

    def __post_init__(self) -> None:
        _choice("batch.test", self.test, TESTS)
        _choice("batch.formula", self.formula, FORMULAS)
        _choice("batch.estimator", self.estimator, ESTIMATORS)
        _positive("batch.initial", self.initial, integer=True)
        _positive("batch.max", self.max, integer=True)
        if self.max < self.initial:
            raise ValueError(f"batch.max: {self.max} must be >= batch.initial ({self.initial})")
        for name in ("eta", "vartheta", "nu"):
            _positive(f"batch.{name}", getattr(self, name))
        _positive("batch.probe_chunks", self.probe_chunks, integer=True)
        if self.probe_chunks < 2:
            raise ValueError(
                f"batch.probe_chunks: {self.probe_chunks} must be >= 2 (a variance needs two samples)"
            )

    @property
    def probing(self) -> bool:
        """Whether gradient statistics are taken at all."""
        return self.test != "none" or self.statistics


@dataclass(frozen=True)
class Merging:
    """Trainer merging and worker allocation (ALGORITHM.md §3–4): every ``every`` rounds while more than one
    trainer lives, ``size`` trainers chosen by ``policy`` merge into the lowest id."""

    policy: str = "smallest"
    every: int = 2
    size: int = 2
    survivor_batch: str = "max"
    allocation: str = "requests"

    def __post_init__(self) -> None:
        _choice("merge.policy", self.policy, POLICIES)
        _choice("merge.survivor_batch", self.survivor_batch, SURVIVOR)
        _choice("merge.allocation", self.allocation, ALLOCATIONS)
        _positive("merge.every", self.every, integer=True)
        _positive("merge.size", self.size, integer=True)
        if self.size < 2:
            raise ValueError(f"merge.size: {self.size} must be >= 2 (trainers merged into one)")


@dataclass(frozen=True)
class Switch:
    """When gradient accumulation pays (ALGORITHM.md §5): ``threshold`` accumulates only when b > κ·b_max."""

    mode: str = "threshold"
    kappa: float = 2.0
    schedule: str = "fixed"

    def __post_init__(self) -> None:
        _choice("switch.mode", self.mode, MODES)
        _choice("switch.schedule", self.schedule, SCHEDULES)
        _positive("switch.kappa", self.kappa)
        if self.kappa < 1:
            raise ValueError(f"switch.kappa: {self.kappa} must be >= 1")


@dataclass(frozen=True)
class Outer:
    """The outer step on the pseudo-gradient Δ (ALGORITHM.md §1, step 4): ``average`` (θ ← mean of the workers),
    ``sgd`` (θ ← θ − lr·Δ) or ``nesterov`` (PyTorch SGD semantics, DiLoCo: lr 0.7, momentum 0.9)."""

    optimizer: str = "average"
    lr: float = 1.0
    momentum: float = 0.0

    def __post_init__(self) -> None:
        _choice("outer.optimizer", self.optimizer, OUTERS)
        _positive("outer.lr", self.lr)
        _positive("outer.momentum", self.momentum, zero=True)
        if self.momentum >= 1:
            raise ValueError(f"outer.momentum: {self.momentum} must be < 1")

    @classmethod
    def nesterov(cls, lr: float = 0.7, momentum: float = 0.9) -> Outer:
        return cls("nesterov", lr, momentum)

    @classmethod
    def sgd(cls, lr: float = 0.5) -> Outer:
        return cls("sgd", lr)
