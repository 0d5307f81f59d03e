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
    def step(self, theta: torch.Tensor, delta: torch.Tensor, part: slice = slice(None)) -> None:
        """θ[part] and its momentum stepped on ``delta`` (Δ of that part: a streaming fragment's)."""
        v = self.ensure_state(theta)[part] if self.kind == "nesterov" else None
        theta = theta[part]
        if self.kind == "average":
            theta.sub_(delta)
        elif self.kind == "sgd":
            theta.sub_(delta, alpha=self.lr)
        else:
            assert v is not None
            v.mul_(self.mu).add_(delta)
            theta.sub_(delta, alpha=self.lr).sub_(v, alpha=self.lr * self.mu)

    @torch.no_grad()
    def trial(self, theta: torch.Tensor, delta: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` ← the θ that :meth:`step` would give, leaving θ and the momentum as they are (the eager
        outer step of one worker's own Δ, ALGORITHM.md §13); returns ``out``."""
        if self.kind == "average":
            return torch.sub(theta, delta, out=out)
        if self.kind == "sgd":
            return torch.sub(theta, delta, alpha=self.lr, out=out)
        v = self.ensure_state(theta)  # θ − lr·Δ − lr·μ·(μv + Δ)
        torch.add(delta, v, alpha=self.mu, out=out)
        out.mul_(self.mu).add_(delta)
        return out.mul_(-self.lr).add_(theta)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.v is None else {"momentum": self.v}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        v = state.get("momentum")
        self.v = None if v is None else v.detach().to(torch.float32, copy=True)
