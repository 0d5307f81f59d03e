"""Trainer merging (ALGORITHM.md §3): the set S, the batch weights, the survivor and the weighted merge."""

from __future__ import annotations

import pytest
import torch

from adloco.library.algorithms.merging import merged_request, select, survivor, weighted_merge, weights
from adloco.library.algorithms.outer import OuterOptimizer


def test_select_smallest() -> None:
    requests = {0: 8, 1: 4, 2: 16, 3: 2}
    assert select(requests, "smallest", 2) == [1, 3]
    assert select(requests, "smallest", 3) == [0, 1, 3]


def test_select_smallest_ties_by_trainer_id() -> None:
    assert select({0: 4, 1: 4, 2: 4}, "smallest", 2) == [0, 1]
    assert select({5: 4, 2: 4, 9: 1, 3: 4}, "smallest", 2) == [2, 9]
    assert select({3: 8, 1: 2, 4: 2, 0: 2}, "smallest", 2) == [0, 1]


def test_select_result_is_sorted_by_id() -> None:
    assert select({7: 1, 2: 3, 5: 100}, "smallest", 2) == [2, 7]


def test_select_largest_with_smallest() -> None:
    requests = {0: 8, 1: 4, 2: 16, 3: 2}
    assert select(requests, "largest_with_smallest", 2) == [2, 3]
    assert select(requests, "largest_with_smallest", 3) == [1, 2, 3]
    # ties for the largest: the lowest id; ties for the smallest: the lowest ids
    assert select({0: 8, 1: 8, 2: 2}, "largest_with_smallest", 2) == [0, 2]
    assert select({0: 2, 1: 8, 2: 2, 3: 8}, "largest_with_smallest", 2) == [0, 1]
    assert select({0: 4, 1: 4, 2: 4}, "largest_with_smallest", 2) == [0, 1]


def test_select_nothing_to_merge() -> None:
    assert select({0: 1, 1: 2, 2: 3}, "none", 2) == []
    assert select({0: 1}, "smallest", 2) == []
    assert select({0: 1}, "largest_with_smallest", 2) == []
    assert select({}, "smallest", 2) == []


def test_select_size_larger_than_trainers() -> None:
    assert select({0: 3, 1: 1}, "smallest", 5) == [0, 1]
    assert select({0: 3, 1: 1, 2: 2}, "largest_with_smallest", 5) == [0, 1, 2]


def test_select_unknown_policy() -> None:
    with pytest.raises(ValueError):
        select({0: 1, 1: 2}, "biggest", 2)


def test_weights() -> None:
    requests = {0: 8, 1: 4, 2: 16, 3: 2}
    w = weights(requests, [1, 2, 3])
    assert set(w) == {1, 2, 3}
    assert sum(w.values()) == pytest.approx(1.0, abs=1e-15)
    assert w == pytest.approx({1: 4 / 22, 2: 16 / 22, 3: 2 / 22}, rel=1e-15)


def test_survivor_and_merged_request() -> None:
    requests = {2: 8, 5: 32, 7: 4}
    members = [2, 5, 7]
    keep = survivor(members)
    assert keep == 2
    assert survivor([9, 4, 6]) == 4
    assert merged_request(requests, members, "max", keep) == 32
    assert merged_request(requests, members, "own", keep) == 8
    assert merged_request(requests, [5, 7], "own", survivor([5, 7])) == 32
    with pytest.raises(ValueError):
        merged_request(requests, members, "min", keep)


def test_weighted_merge_by_hand() -> None:
    a = torch.tensor([1.0, 2.0, -3.0, 0.5])
    b = torch.tensor([5.0, -2.0, 3.0, 4.5])
    requests = {0: 1, 3: 3}
    w = weights(requests, [0, 3])
    out = weighted_merge({0: a, 3: b}, w)
    expected = torch.tensor([0.25 * 1 + 0.75 * 5, 0.25 * 2 - 0.75 * 2, -0.25 * 3 + 0.75 * 3, 0.125 + 3.375])
    torch.testing.assert_close(out, expected)
    # the inputs are not modified
    torch.testing.assert_close(a, torch.tensor([1.0, 2.0, -3.0, 0.5]))


def test_weighted_merge_three_members_uneven() -> None:
    ts = {1: torch.full((3,), 2.0), 4: torch.full((3,), 10.0), 6: torch.tensor([0.0, 1.0, 2.0])}
    w = weights({1: 2, 4: 6, 6: 2}, [1, 4, 6])
    out = weighted_merge(ts, w)
    expected = 0.2 * 2.0 + 0.6 * 10.0 + 0.2 * torch.tensor([0.0, 1.0, 2.0])
    torch.testing.assert_close(out, expected)


def test_weighted_merge_accumulates_in_float32() -> None:
    a = torch.tensor([1.0, 3.0], dtype=torch.bfloat16)
    b = torch.tensor([2.0, 5.0], dtype=torch.bfloat16)
    out = weighted_merge({0: a, 1: b}, {0: 0.3, 1: 0.7})
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([0.3 + 1.4, 0.9 + 3.5]))
    d = weighted_merge({0: a.double(), 1: b.double()}, {0: 0.3, 1: 0.7})
    assert d.dtype == torch.float64


def test_weighted_merge_of_outer_momentum() -> None:
    """Momentum buffers are merged with the same batch weights as the parameters."""
    opts = {0: OuterOptimizer("nesterov", lr=0.7, momentum=0.9), 2: OuterOptimizer("nesterov", 0.7, 0.9)}
    deltas = {0: torch.tensor([1.0, -1.0, 2.0]), 2: torch.tensor([3.0, 1.0, 0.0])}
    for t, opt in opts.items():
        theta = torch.zeros(3)
        opt.step(theta, deltas[t])
        opt.step(theta, deltas[t])  # v = 1.9 Δ
    w = weights({0: 4, 2: 12}, [0, 2])
    v = weighted_merge({t: opt.state_dict()["momentum"] for t, opt in opts.items()}, w)
    expected = 1.9 * (0.25 * deltas[0] + 0.75 * deltas[2])
    torch.testing.assert_close(v, expected)
