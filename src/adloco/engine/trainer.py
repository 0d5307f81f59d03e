"""One trainer (spec §0): a model instance with its own request, data subset, θ and outer optimizer.

The request and the subset are replicated on every process (decisions need them); θ and the outer
optimizer's state live only on processes that host one of the trainer's workers (``hosted``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from adloco.algorithms.outer import OuterOptimizer


@dataclass
class Trainer:
    id: int
    request: int  # b: the per-worker batch size it asks for
    subset: np.ndarray  # the training blocks it draws from
    outer: OuterOptimizer
    theta: torch.Tensor | None = None  # (P,) flat parameters, where hosted

    @property
    def hosted(self) -> bool:
        return self.theta is not None

    @torch.no_grad()
    def outer_step(self, delta: torch.Tensor) -> None:
        """θ ← OuterOpt(θ, Δ), Δ the (all-reduced) pseudo-gradient θ − mean of the workers' θ_m."""
        assert self.theta is not None
        self.outer.step(self.theta, delta)

    def momentum(self) -> torch.Tensor | None:
        """The outer momentum buffer (created at zero), or None for optimizers without one."""
        if not self.outer.has_state or self.theta is None:
            return None
        return self.outer.ensure_state(self.theta)
