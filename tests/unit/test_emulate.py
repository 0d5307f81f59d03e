"""``network.emulate`` (ALGORITHM.md §7): every counted collective held back to its time on the modelled link.

The hold itself, priced against :func:`adloco.netmodel.collective_seconds` with the sleep recorded
instead of slept (exact amounts, one hold per participating thread, none for what is not counted); a run
held to the link, collective by collective, with the same decisions as without emulation; and a bad value.
Nothing here reads a clock: the real sleeps, and wall time against simulated time, are measured in the
slower tier (tests/integration/test_emulate_dist.py).
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable, Iterator

import pytest
import torch

from adloco.library.comm import base
from adloco.library.comm.inprocess import InProcessComm
from adloco.library.comm.threads import Hub, ThreadComm
from adloco.netmodel import Link, Network, collective_seconds, comm_seconds
from tests.helpers import driver, on_threads, run_main, slow_link_rounds, tiny_config

BW, LAT = 1e4, 2e-3  # 10 kB/s and 2 ms: 400 bytes take 40 ms


@pytest.fixture
def holds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, float]]]:
    """The holds asked for, as (thread id, seconds), recorded instead of slept (a fake clock that reads
    every collective's own duration as 0)."""
    asked: list[tuple[int, float]] = []
    lock = threading.Lock()

    def fake(seconds: float) -> float:
        with lock:
            asked.append((threading.get_ident(), seconds))
        return max(seconds, 0.0)

    monkeypatch.setattr(base, "hold", fake)
    # the collectives' own durations read as 0: a collective a busy machine made slower than its modelled
    # time would otherwise need no hold, and the count below would depend on the machine's load
    monkeypatch.setattr(base, "time", types.SimpleNamespace(perf_counter=lambda: 0.0, sleep=time.sleep))
    yield asked


def _add(value: float) -> Callable[[torch.Tensor], None]:
    return lambda out: out.add_(value)


def test_every_counted_collective_is_held_back_to_its_modelled_time(holds: list[tuple[int, float]]) -> None:
    comm = InProcessComm(4, link=(BW, LAT))
    assert comm.link == Link(BW, LAT)
    out = torch.zeros(100)  # 400 bytes of float32
    comm.reduce({w: _add(1.0) for w in range(4)}, [0, 1, 2], "delta", out)
    comm.broadcast(out, 0, [0, 3], "move")
    comm.all_gather_rows({w: [1.0, 2.0, 3.0] for w in range(4)}, 3, "stats", counted=2)
    ctl = torch.zeros(101)  # 100 values counted, 1 of control: one hold, for the counted body
    comm.reduce({w: _add(1.0) for w in range(2)}, [0, 1], "grad", ctl, control=1)
    expected = [
        collective_seconds("all_reduce", 3, 400, BW, LAT),
        collective_seconds("broadcast", 2, 400, BW, LAT),
        collective_seconds("all_gather", 4, 16, BW, LAT),
        collective_seconds("all_reduce", 2, 400, BW, LAT),
    ]
    records = comm.drain()
    assert [(r.kind, r.op, r.workers, r.payload) for r in records] == [
        ("delta", "all_reduce", 3, 400),
        ("move", "broadcast", 2, 400),
        ("stats", "all_gather", 4, 16),
        ("grad", "all_reduce", 2, 400),
    ]
    # each held back by what the real collective (next to nothing in one process) left of its modelled
    # time, once, and recorded at its modelled time
    assert len(holds) == 4
    for (_, asked), modelled in zip(holds, expected, strict=True):
        assert modelled - 0.005 < asked <= modelled
    assert [r.seconds for r in records] == pytest.approx(expected)
    # not counted, not held: uncounted gathers (checks, evaluation), a group of one worker, and no link
    holds.clear()
    comm.all_gather_rows({w: [1.0] for w in range(4)}, 1, "check", counted=0)
    comm.reduce({0: _add(1.0)}, [0], "delta", out)
    comm.link = None
    comm.reduce({w: _add(1.0) for w in range(4)}, [0, 1, 2, 3], "delta", out)
    assert holds == []
    assert comm.drain()[-1].seconds < collective_seconds("all_reduce", 4, 400, BW, LAT)


def test_threads_hold_back_once_per_thread_that_takes_part(holds: list[tuple[int, float]]) -> None:
    owner = {0: 0, 1: 0, 2: 1}  # thread 0 hosts workers 0 and 1, thread 1 worker 2
    hub = Hub(2, timeout=30)
    comms = [ThreadComm(hub, r, owner, link=(BW, LAT)) for r in range(2)]
    idents: dict[int, int] = {}

    def work(rank: int) -> None:
        comm = comms[rank]
        idents[rank] = threading.get_ident()
        parts = {w: _add(1.0) for w in comm.local_workers}
        out = torch.zeros(100)
        comm.reduce(parts, [0, 1, 2], "delta", out)  # both threads take part: each holds once
        comm.broadcast(out, 0, [0, 1], "move")  # thread 0 alone hosts these workers

    on_threads(hub, work)
    per_thread = {r: [s for i, s in holds if i == idents[r]] for r in range(2)}
    assert len(per_thread[0]) == 2 and len(per_thread[1]) == 1  # not once per worker hosted
    recs = [comm.drain() for comm in comms]
    for r in recs:  # every thread counts every collective the same way
        assert [(x.kind, x.workers, x.payload) for x in r] == [("delta", 3, 400), ("move", 2, 400)]
        assert r[0].seconds == pytest.approx(collective_seconds("all_reduce", 3, 400, BW, LAT))
    modelled = collective_seconds("broadcast", 2, 400, BW, LAT)
    assert recs[0][1].seconds == pytest.approx(modelled) and recs[1][1].seconds < modelled


def test_a_bad_link_is_refused() -> None:
    with pytest.raises(ValueError, match=r"link: bandwidth 0 must be a finite number > 0"):
        InProcessComm(2, link=(0, 1e-3))
    with pytest.raises(ValueError, match=r"link: latency -1 must be a finite number >= 0"):
        InProcessComm(2, link=(1e6, -1))
    with pytest.raises(ValueError, match=r"must be \(bandwidth, latency\), a Link or None"):
        InProcessComm(2, link=1e6)  # type: ignore[arg-type]


def test_an_emulated_run_holds_each_collective_to_its_modelled_time_and_decides_the_same(
    holds: list[tuple[int, float]],
) -> None:
    """The holds recorded, not slept (no wall time in this test): every counted collective of a run with
    merges, moves, Δ and statistics is held back once, to its modelled time, and the run decides what the
    same run without the link decides. That its wall time is then its simulated time: the slower tier
    (tests/integration/test_emulate_dist.py), with a margin for a busy machine."""
    emulated = slow_link_rounds(True, 3)
    asked = len(holds)
    for r in emulated:  # the round's time in counted collectives is their modelled time (a hold's share)
        modelled = comm_seconds(r["collectives"], 1e5, 1e-3)
        assert r["comm_s"] >= modelled * (1 - 1e-9) and modelled > 0
    assert asked == sum(count for r in emulated for _, _, n, _, count, *_ in r["collectives"] if n > 1)
    holds.clear()
    real = slow_link_rounds(False, 3)
    assert holds == []  # no link: nothing held
    same = ("loss", "requests", "requests_next", "allocation", "collectives", "bytes", "communications")
    for a, b in zip(emulated, real, strict=True):  # it only sleeps: nothing decided depends on it
        assert {k: a[k] for k in same} == {k: b[k] for k in same}


def test_a_bad_emulate_value_is_one_line() -> None:
    ran = run_main("train", "--set", "network.emulate=maybe")
    assert ran.returncode == 2
    assert ran.stderr == "adloco: error: config: network.emulate = 'maybe': must be true or false\n"
    assert tiny_config().network.emulate is False  # off unless asked


def test_an_emulated_link_across_sites_holds_to_the_sites_time(holds: list[tuple[int, float]]) -> None:
    net = Network(BW, LAT, sites=(2, 2), site_bandwidth=BW / 10, site_latency=0.05)
    comm = InProcessComm(4, link=net)
    out = torch.zeros(100)  # 400 bytes
    comm.reduce({w: _add(1.0) for w in (0, 1)}, [0, 1], "delta", out)  # inside site 0
    comm.reduce({w: _add(1.0) for w in (0, 2)}, [0, 2], "delta", out)  # across the two sites
    assert [s for _, s in holds] == pytest.approx(
        [
            collective_seconds("all_reduce", 2, 400, BW, LAT),
            collective_seconds("all_reduce", 2, 400, BW / 10, 0.05),
        ],
        rel=0.2,  # less what the real collective took
    )


def test_a_run_on_sites_prices_its_rounds_on_them() -> None:
    """The engine's simulated time takes network.sites: DiLoCo's Δ among 4 workers in two sites costs the
    hierarchical all-reduce, slower than the same link without sites."""
    rows = []
    for sites in ([], [2, 2]):
        cfg = tiny_config(
            "algorithm.method=diloco",
            "algorithm.trainers=1",
            "algorithm.rounds=1",
            f"network.sites={sites}",
            "network.site_bandwidth=1e4",
        )
        d = driver(cfg)
        d.run_round()
        rows.append(d.sim_s)
    assert rows[1] > rows[0] + 1.0  # 14.5 kB between sites at 10 kB/s: over a second more
