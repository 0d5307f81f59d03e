"""b_max on CUDA (ALGORITHM.md §5): the largest micro-batch whose step peaks under a share of the free memory."""

from __future__ import annotations

from collections.abc import Callable

import torch


def largest_fitting(fits: Callable[[int], bool], hi: int) -> int:
    """The largest b in [1, hi] with ``fits(b)``, for a monotone ``fits`` (doubling, then bisection);
    1 when even one row does not fit (training then tells, with a clear out-of-memory error)."""
    lo, b = 0, 1
    while b <= hi and fits(b):
        lo, b = b, b * 2
    top = min(b, hi + 1)  # the smallest size known not to fit (or beyond the range)
    while top - lo > 1:
        mid = (lo + top) // 2
        if fits(mid):
            lo = mid
        else:
            top = mid
    return max(lo, 1)


def cuda_b_max(
    step: Callable[[int], None], budget_bytes: float, state_bytes: int, hi: int, device: torch.device
) -> int:
    """Search b_max with ``step(b)`` running forward and backward on b rows.

    A size fits when its peak allocation above the current one, plus ``state_bytes`` for optimizer
    state not yet allocated, stays under ``budget_bytes``; running out of memory means it does not.
    """

    def fits(b: int) -> bool:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        try:
            step(b)
            torch.cuda.synchronize(device)
        except torch.OutOfMemoryError:
            return False
        finally:
            torch.cuda.empty_cache()
        return torch.cuda.max_memory_allocated(device) - base + state_bytes <= budget_bytes

    return largest_fitting(fits, hi)
