"""``runtime.threads: 0`` in one process: the thread count follows the cores other work leaves free
(adloco.engine.threads), read from fake CPU counters and a fake clock."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from adloco.engine import threads
from adloco.engine.threads import AutoThreads, pick, read_counters


@pytest.fixture(autouse=True)
def _threads_restored() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Machine:
    """Two cores; ``others`` of them busy with other work, this process busy on ``mine``."""

    def __init__(self) -> None:
        self.t, self.busy, self.own = 0.0, 0.0, 0.0
        self.others, self.mine = 0.0, 1.0

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.busy += (self.others + self.mine) * seconds
        self.own += self.mine * seconds

    def auto(self, log: list[str]) -> AutoThreads:
        return AutoThreads(
            log.append,
            every=3.0,
            counters=lambda: (self.busy, 2 * self.t),
            own=lambda: self.own,
            clock=lambda: self.t,
            ceiling=2,
        )


def test_pick_leaves_the_busy_cores_to_the_other_work() -> None:
    assert [pick(2, x) for x in (0.0, 0.4, 0.6, 1.0, 2.0, 5.0)] == [2, 2, 1, 1, 1, 1]
    assert pick(8, 3.2) == 5 and pick(1, 0.0) == 1


def test_threads_follow_the_free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "affinity", lambda: [0, 1])
    m, log = Machine(), []
    auto = m.auto(log)
    m.others = 1.0  # another process busy on one core from the start
    m.advance(10)
    assert auto.check() == 1 and torch.get_num_threads() == 1  # the first reading decides alone
    assert log == ["threads: 2 -> 1 (other work kept 1.0 of 2 cores busy)"]
    m.advance(1)
    assert auto.check() == 1  # not due: read at most every 3 s
    m.others = 0.0  # the other work ended
    m.advance(3)
    assert auto.check() == 1  # once is not enough to change
    m.advance(3)
    assert auto.check() == 2 and torch.get_num_threads() == 2
    m.others = 0.9  # a blip, then free again: no change
    m.advance(3)
    assert auto.check() == 2
    m.others = 0.0
    m.advance(3)
    assert auto.check() == 2 and len(log) == 2


def test_no_change_above_torchs_own_count_or_without_counters() -> None:
    torch.set_num_threads(1)  # OMP_NUM_THREADS=1, or the one core of the affinity
    auto = AutoThreads(counters=lambda: (0.0, 1.0), clock=lambda: 100.0)
    assert auto.ceiling == 1 and auto.check() == 1
    blind = AutoThreads(counters=lambda: None, ceiling=2, clock=lambda: 100.0)
    assert blind.check() == 2 and torch.get_num_threads() == 1  # unreadable: torch's count stays


def test_counters_of_the_affinitys_cpus(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  300 0 100 500 0 0 0 0 0 0\n"
        "cpu0 100 0 50 200 10 0 0 0 0 0\n"
        "cpu1 200 0 50 300 0 0 0 0 0 0\n"
        "intr 123\n"
    )
    tick = float(os.sysconf("SC_CLK_TCK"))
    busy, total = read_counters([1], str(stat)) or (0.0, 0.0)
    assert (busy, total) == pytest.approx((250 / tick, 550 / tick))
    assert read_counters([0], str(stat)) == pytest.approx((150 / tick, 360 / tick))  # iowait is idle
    assert read_counters([7], str(stat)) is None and read_counters([0], str(tmp_path / "none")) is None


def test_a_run_in_one_process_follows_the_free_cores_between_inner_steps() -> None:
    from adloco.engine.placement import place
    from tests.helpers import driver, tiny_config

    cfg = tiny_config()
    assert isinstance(place(cfg, None).threads, AutoThreads)  # runtime.threads 0: follow the free cores
    fixed = place(tiny_config("runtime.threads=1"), None)
    assert fixed.threads is None and torch.get_num_threads() == 1  # a count the user set stays
    d = driver(cfg)
    calls: list[int] = []
    d.between_steps = lambda: calls.append(d.algo.step_in_round)
    d.run_round()
    assert calls == list(range(cfg.algorithm.inner_steps))  # before every inner step
