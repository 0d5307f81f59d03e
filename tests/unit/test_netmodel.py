"""The network model of simulated wall time (ALGORITHM.md §7), against hand computations."""

from __future__ import annotations

import pytest

from adloco.netmodel import collective_seconds, comm_seconds, round_seconds

BW, LAT = 100e6, 2e-3  # 100 MB/s, 2 ms


def test_ring_all_reduce() -> None:
    # 4 workers, 8 MB: 2·3/4 · 8e6/1e8 = 0.12 s of bandwidth + 2·3 · 2 ms = 0.012 s of latency
    assert collective_seconds("all_reduce", 4, 8_000_000, BW, LAT) == pytest.approx(0.132)


def test_broadcast_and_gather() -> None:
    # broadcast to 5: 1e6/1e8 = 0.01 s + ceil(log2 5) = 3 hops · 2 ms
    assert collective_seconds("broadcast", 5, 1_000_000, BW, LAT) == pytest.approx(0.016)
    # all-gather of 32 bytes each among 4: 3 · 32/1e8 + 3 · 2 ms
    assert collective_seconds("all_gather", 4, 32, BW, LAT) == pytest.approx(0.006 + 96 / 1e8)


def test_one_worker_costs_nothing() -> None:
    assert collective_seconds("all_reduce", 1, 10**9, BW, LAT) == 0.0


def test_a_round() -> None:
    rows = [["delta", "all_reduce", 4, 8_000_000, 1], ["stats", "all_gather", 4, 32, 2]]
    comm = 0.132 + 2 * (0.006 + 96 / 1e8)
    assert comm_seconds(rows, BW, LAT) == pytest.approx(comm)
    compute = {0: 3.0, 1: 4.0, 2: 2.0, 3: 1.0}
    assert round_seconds(compute, rows, BW, LAT) == pytest.approx(4.0 + comm)
    # worker 1 twice as fast, worker 3 four times slower: the slowest is now worker 3 (1.0 / 0.25 = 4.0)
    assert round_seconds(compute, rows, BW, LAT, [1, 2, 1, 0.25]) == pytest.approx(4.0 + comm)
    assert round_seconds(compute, rows, BW, LAT, [1, 2, 1, 1]) == pytest.approx(3.0 + comm)
