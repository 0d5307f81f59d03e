"""The inner learning rate follows the batch (ALGORITHM.md §10): a multiplier per trainer.

With AdamW a step's size barely depends on the batch, so a request grown at a fixed inner lr moves θ less
per example. ``sqrt`` multiplies the scheduled lr by √(b_t/b₀) (Malladi et al. 2205.10287; OLMo's batch-size
schedule); ``gain`` by the square root of AdaScale's gain (2007.05105) r_t = (1 + B̂/b₀)/(1 + B̂/b_t), which
lies in [1, b_t/b₀] and stays near 1 while the gradient noise is small against the gradient (B̂, an
exponential moving average of the norm test's own per-example noise ratio σ̂²/‖ḡ‖², measures that). b₀ is
the rows of the trainer's first steps, b_t the rows its steps use now (a request capped to b_max counts as
b_max). For SGD inner optimizers (LocalSGD) the rule is linear in r_t instead of its square root. Every
multiplier is capped at ``cap``. The weight decay may follow too (``batch.wd_scaling``: :func:`wd_multiplier`).
"""

from __future__ import annotations

import math
from typing import Any

NOISE_EMA = 0.5  # weight of each round's measurement in B̂


def ratio(rule: str, b_t: float, b0: float, noise: float | None) -> float:
    """r_t, the ratio whose square root (linear for SGD) multiplies the lr: 1 for ``none``; b_t/b₀ for
    ``sqrt``; AdaScale's gain for ``gain`` (1 until the noise ratio was measured)."""
    if rule == "none" or b0 <= 0:
        return 1.0
    if rule == "sqrt":
        return b_t / b0
    if rule == "gain":
        if noise is None or not math.isfinite(noise) or noise < 0:
            return 1.0
        return (1.0 + noise / b0) / (1.0 + noise / b_t)
    raise ValueError(f"unknown lr scaling rule {rule!r}")


def multiplier(r: float, linear: bool, cap: float) -> float:
    """The lr multiplier of ratio ``r``: √r (AdamW and the like), or r itself (``linear``: SGD), at most
    ``cap``."""
    return min(r if linear else math.sqrt(r), cap)


def wd_multiplier(rule: str, grown: float, lr_multiplier: float) -> float:
    """The weight decay's multiplier (``batch.wd_scaling``): 1 for ``none``; for ``timescale``
    (b_t/b₀) / the lr's multiplier, so that lr × weight decay, the fraction of θ a step decays, grows as
    the batch does: AdamW's averaging timescale in examples, b/(lr·λ) (Wang and Aitchison 2405.13698),
    stays at its start. ``grown``: b_t/b₀."""
    if rule == "none":
        return 1.0
    if rule == "timescale":
        return grown / lr_multiplier
    raise ValueError(f"unknown weight decay scaling rule {rule!r}")


def check_wd(rule: str, optimizers: list[Any], cuda_graphs: bool) -> None:
    """A ``wd_scaling`` rule that would silently do nothing, refused (ValueError): no param group of the
    inner optimizers has a weight decay, or the steps are CUDA graphs (a captured step keeps its λ)."""
    if rule == "none":
        return
    if not any(g.get("weight_decay") for o in optimizers for g in o.param_groups):
        raise ValueError(f"wd_scaling {rule!r}: the inner optimizer has no weight decay to scale")
    if cuda_graphs:
        raise ValueError(
            f"wd_scaling {rule!r}: a step captured as a CUDA graph keeps the weight decay it was captured with"
        )


def update_noise(noise: float | None, sigma2: float | None, gbar_sq: float | None) -> float | None:
    """B̂ after a round that measured σ̂² and ‖ḡ‖² (unchanged when either is missing or not finite)."""
    if sigma2 is None or gbar_sq is None or not (math.isfinite(sigma2) and math.isfinite(gbar_sq)):
        return noise
    if gbar_sq <= 0:
        return noise
    b = sigma2 / gbar_sq
    return b if noise is None else NOISE_EMA * b + (1.0 - NOISE_EMA) * noise
