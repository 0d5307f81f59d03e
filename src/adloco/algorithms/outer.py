"""Outer optimizers on the pseudo-gradient Δ = θ − mean_m θ_m (ALGORITHM.md §1, step 4)."""

from __future__ import annotations

import torch


class OuterOptimizer:
    """One trainer's outer step, in place on a flat parameter tensor θ.

    ``average``: θ ← θ − Δ (LocalSGD; SGD with lr 1). ``sgd``: θ ← θ − lr·Δ.
    ``nesterov``: v ← μv + Δ; θ ← θ − lr(Δ + μv) (PyTorch SGD semantics; v starts at 0).
    The momentum v is float32 whatever dtype Δ travelled in.
    """

    def __init__(self, kind: str, lr: float = 1.0, momentum: float = 0.0) -> None:
        if kind not in ("average", "sgd", "nesterov"):
            raise ValueError(f"unknown outer optimizer {kind!r}")
        self.kind, self.lr, self.mu = kind, lr, momentum
        self.v: torch.Tensor | None = None

    @property
    def has_state(self) -> bool:
        return self.kind == "nesterov"

    def ensure_state(self, like: torch.Tensor) -> torch.Tensor:
        """The momentum buffer (created at zero on first use)."""
        if self.v is None:
            self.v = torch.zeros_like(like, dtype=torch.float32)
        return self.v

    @torch.no_grad()
    def step(self, theta: torch.Tensor, delta: torch.Tensor) -> None:
        if self.kind == "average":
            theta.sub_(delta)
        elif self.kind == "sgd":
            theta.sub_(delta, alpha=self.lr)
        else:
            v = self.ensure_state(theta)
            v.mul_(self.mu).add_(delta)
            theta.sub_(delta, alpha=self.lr).sub_(v, alpha=self.lr * self.mu)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.v is None else {"momentum": self.v}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        v = state.get("momentum")
        self.v = None if v is None else v.detach().to(torch.float32, copy=True)
