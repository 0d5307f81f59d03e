"""Validation: perplexity for language models, accuracy for classification."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from adloco.library.graphs import to_device


@dataclass(frozen=True)
class EvalResult:
    loss: float  # LM: mean token negative log-likelihood; classification: mean cross-entropy per example
    accuracy: float | None  # classification only
    count: int  # tokens scored (LM) or examples (classification)


def spread(n: int, limit: int | None) -> np.ndarray:
    """Validation example indices: all ``n``, or ``limit`` of them spread evenly over the split."""
    if limit is None or limit >= n:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, limit).round().astype(np.int64))


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batch: Callable[[np.ndarray], dict[str, torch.Tensor]],
    indices: np.ndarray,
    batch_size: int,
    task: str = "causal_lm",
    amp: torch.dtype | None = None,
) -> EvalResult:
    """Evaluate the validation examples ``indices`` (under autocast to ``amp`` when given: the run's
    mixed precision, so evaluation runs the GEMMs training runs).

    LM: every block of T tokens scores T−1 next-token predictions (labels are the inputs; the model
    shifts them), so the split's mean NLL is Σ_batches loss_b·B·(T−1) / Σ B·(T−1), and the perplexity
    exp of that: not a mean of per-batch perplexities.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device, dtype=torch.float64)
    correct = 0
    count = 0
    for start in range(0, len(indices), batch_size):
        b = to_device(batch(indices[start : start + batch_size]), device)
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            out = model(**b)
        rows = b["input_ids"].shape[0]
        if task == "classification":
            total += out.loss.double() * rows
            correct += int((out.logits.argmax(-1) == b["labels"]).sum())
            count += rows
        else:
            scored = rows * (b["input_ids"].shape[1] - 1)
            total += out.loss.double() * scored
            count += scored
    model.train(was_training)
    loss = (total / max(count, 1)).item()
    return EvalResult(loss, correct / count if task == "classification" and count else None, count)


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf
