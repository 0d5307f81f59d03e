"""Validation loss and perplexity: exp(mean token negative log-likelihood) over the held-out blocks."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn


@torch.no_grad()
def evaluate(
    model: nn.Module, blocks: Callable[[int, int], torch.Tensor], n_blocks: int, batch_size: int
) -> tuple[float, int]:
    """(mean token NLL, tokens scored) over validation blocks 0..n_blocks-1.

    Every block of T tokens scores T-1 next-token predictions (labels are the inputs; the model shifts
    them), so the mean over the split is Σ_batches loss_batch·B·(T−1) / Σ B·(T−1).
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device, dtype=torch.float64)
    tokens = 0
    for start in range(0, n_blocks, batch_size):
        x = blocks(start, min(n_blocks, start + batch_size)).to(device, non_blocking=True)  # (B, T)
        n = x.shape[0] * (x.shape[1] - 1)
        total += model(input_ids=x, labels=x).loss.double() * n
        tokens += n
    model.train(was_training)
    return (total / max(tokens, 1)).item(), tokens


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf
