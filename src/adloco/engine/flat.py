"""A module's parameters and gradients as views of two flat float32 buffers.

Copying θ in and out, forming Δ, clipping, reducing and checking finiteness are then single tensor ops
on P contiguous values, and the inner optimizer runs on two tensors (matrices with weight decay, the rest
without) instead of dozens. Autograd accumulates into the gradient views in place (as DDP's
``gradient_as_bucket_view`` does), so gradients are zeroed, never set to None.
"""

from __future__ import annotations

import torch
from torch import nn


class FlatModule:
    def __init__(self, module: nn.Module) -> None:
        params = list(module.parameters())  # unique: tied weights appear once
        decay = [p for p in params if p.ndim >= 2]
        other = [p for p in params if p.ndim < 2]
        device = params[0].device
        self.numel = sum(p.numel() for p in params)
        self.n_decay = sum(p.numel() for p in decay)
        self.param = torch.empty(self.numel, device=device, dtype=torch.float32)  # (P,)
        self.grad = torch.zeros(self.numel, device=device, dtype=torch.float32)  # (P,)
        offset = 0
        with torch.no_grad():
            for p in decay + other:
                n = p.numel()
                view = self.param[offset : offset + n]
                view.copy_(p.detach().reshape(-1))
                p.data = view.view_as(p)
                p.grad = self.grad[offset : offset + n].view_as(p)
                offset += n
        self.module = module
        # What the inner optimizer sees: two leaf tensors aliasing the flat buffer, grads aliased too.
        self.groups: list[nn.Parameter] = []
        for lo, hi in ((0, self.n_decay), (self.n_decay, self.numel)):
            if hi > lo:
                g = nn.Parameter(self.param[lo:hi])
                g.grad = self.grad[lo:hi]
                self.groups.append(g)
        self.decay_flags = [True, False] if self.n_decay and self.n_decay < self.numel else [self.n_decay > 0]

    def zero_grad(self) -> None:
        self.grad.zero_()

    def clone_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's state dict with every tensor copied out of the shared flat storage."""
        return {k: v.detach().clone() for k, v in self.module.state_dict().items()}
