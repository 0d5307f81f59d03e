"""Trainer merging (ALGORITHM.md §3; AdLoCo paper, section 4.1): which trainers merge, and the batch-weighted merge."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch


def select(requests: Mapping[int, int], policy: str, size: int) -> list[int]:
    """The set S of trainer ids to merge (sorted), or [] when nothing merges.

    ``smallest``: the |S| smallest requests (the paper's policy). ``largest_with_smallest``: the largest
    request together with the |S| - 1 smallest (the reference's other policy). Ties break by trainer id.
    """
    if policy == "none" or len(requests) < 2:
        return []
    size = min(size, len(requests))
    by_small = sorted(requests, key=lambda t: (requests[t], t))
    if policy == "smallest":
        return sorted(by_small[:size])
    if policy == "largest_with_smallest":
        largest = max(requests, key=lambda t: (requests[t], -t))
        rest = [t for t in by_small if t != largest][: size - 1]
        return sorted([largest, *rest])
    raise ValueError(f"unknown merge policy {policy!r}")


def weights(requests: Mapping[int, int], members: Sequence[int]) -> dict[int, float]:
    """w_j = b_j / Σ_{i∈S} b_i: the paper's weights (requested batch sizes)."""
    total = sum(requests[t] for t in members)
    return {t: requests[t] / total for t in members}


def survivor(members: Sequence[int]) -> int:
    """The trainer that remains after a merge: the lowest id (keeps its data subset and its workers)."""
    return min(members)


def merged_request(requests: Mapping[int, int], members: Sequence[int], rule: str, keep: int) -> int:
    """The survivor's request: max_{j∈S} b_j (``max``) or the survivor's own (``own``)."""
    if rule == "max":
        return max(requests[t] for t in members)
    if rule == "own":
        return requests[keep]
    raise ValueError(f"unknown survivor_batch rule {rule!r}")


def weighted_merge(
    tensors: Mapping[int, torch.Tensor], w: Mapping[int, float], like: torch.Tensor | None = None
) -> torch.Tensor:
    """θ_r = Σ_{j∈S} w_j θ_j, accumulated in float32 or wider (used for θ and for outer momentum).

    With several processes each passes the trainers it leads and the partial sums are all-reduced; a
    process leading none passes ``like`` (shape and device) and contributes zeros."""
    ids = sorted(tensors)
    first = tensors[ids[0]] if ids else like
    if first is None:
        raise ValueError("weighted_merge: no tensors and no `like`")
    out = torch.zeros_like(first, dtype=torch.promote_types(first.dtype, torch.float32))
    for t in ids:
        out.add_(tensors[t], alpha=w[t])
    return out
