"""Your own outer optimizer: DiLoCo whose outer step orthogonalizes each weight matrix's update (a
Muon-style step), written here, in your file, as a plain ``torch.optim.Optimizer``, and handed to adloco
through ``Outer(optimizer=...)``.

    python examples/outer_optimizer.py     # 2 workers in this process

adloco calls ``make_outer(params)`` once per trainer. ``params`` is a list holding the trainer's flat
parameters (one tensor, what an element-wise optimizer such as ``torch.optim.SGD`` takes as it is);
``params.shaped()`` gives views of the same memory shaped as the model's parameters, named by
``params.names``, which an optimizer that works on matrices needs. Before each outer step adloco sets their
``.grad`` to the averaged pseudo-gradient Δ; checkpoints, merges and moves carry the optimizer's state.
"""

from __future__ import annotations

import torch
from _common import CharModel, corpus, finish, loss_fn, sample, val_loss

from adloco import DiLoCo, Outer, OuterParams

ROUNDS, H = 6, 10


def orthogonalize(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The nearest semi-orthogonal matrix to ``g`` (its singular values pushed to about 1) by Muon's quintic
    Newton–Schulz iteration: (rows, cols) -> (rows, cols)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (g.norm() + 1e-7)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        s = x @ x.T  # (rows, rows)
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


class OrthogonalSGD(torch.optim.Optimizer):
    """SGD with Nesterov momentum whose update of each matrix is orthogonalized, keeping its size (the
    direction whitened across singular vectors); vectors, and matrices named in ``plain``, step as SGD."""

    def __init__(self, params: list[torch.Tensor], names: list[str], lr: float, momentum: float) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum})
        self.plain = {id(p) for p, n in zip(params, names, strict=True) if "embed" in n}

    @torch.no_grad()
    def step(self, closure: object = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                buf = state.setdefault("momentum_buffer", torch.zeros_like(p))
                buf.mul_(mu).add_(p.grad)
                update = p.grad.add(buf, alpha=mu)  # Nesterov
                if p.ndim == 2 and id(p) not in self.plain:
                    turned = orthogonalize(update)
                    update = turned * (update.norm() / (turned.norm() + 1e-12))
                p.sub_(update, alpha=lr)


def make_outer(params: OuterParams) -> torch.optim.Optimizer:
    """The outer optimizer of one trainer: on ``params.shaped()``, views of its flat θ shaped as the model's."""
    return OrthogonalSGD(params.shaped(), params.names, lr=1.0, momentum=0.3)


def main() -> None:
    train, val = corpus()
    torch.manual_seed(0)
    models = [CharModel() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1) for m in models]
    before = val_loss(models[0], val)
    algo = DiLoCo(
        models, opts, inner_steps=H, batch_size=32, loss_fn=loss_fn, outer=Outer(optimizer=make_outer)
    )
    streams = {w: torch.Generator().manual_seed(1000 + w) for w in algo.local_workers}
    for _ in range(ROUNDS * H):
        algo.step_all({w: sample(train, algo.batch_size(w), streams[w]) for w in algo.local_workers})
    state = algo.state_dict()["trainers"][0]
    print(f"outer state kept for checkpoints: {sorted(k for k in state if k != 'theta')}")
    print(f"validation loss {before:.3f} -> {val_loss(models[0], val):.3f} after {algo.round} rounds")


if __name__ == "__main__":
    main()
    finish()
