"""CPU threads of a run in one process (``runtime.threads: 0``): as many as there are cores free of other
work, re-checked as the run goes.

Why: torch's CPU operations run on a team of OpenMP threads, one per core by default, that wait for each
other at the end of every operation, spinning on their cores. When another process keeps one of those cores
busy, every operation waits for the thread whose core it holds, and the spinning takes time from the other
process too. llama-tiny's inner steps on 2 cores (micro-batches of 8, 4 accumulated) beside one busy
process ran 6 to 10 times slower with 2 threads than with 1; alone, 2 threads were 1.7 times as fast as 1.
So the count follows the cores the other work leaves free, never above torch's own (one a core of the
process's affinity, or ``OMP_NUM_THREADS``): measured from the machine's CPU counters (Linux
``/proc/stat``) less this process's own CPU time, every few seconds between inner steps, and changed only
when two checks in a row agree. Where the counters cannot be read, torch's count stays.

The count can change the order in which a sum's terms are added on some builds; ``runtime.threads: N``
fixes it for a run that must repeat bit for bit on a busy machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

Counters = Callable[[], tuple[float, float] | None]


def affinity() -> list[int]:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def read_counters(cpus: list[int], path: str = "/proc/stat") -> tuple[float, float] | None:
    """(busy, total) seconds of ``cpus`` since boot, from the kernel's counters; None where unreadable."""
    try:
        with open(path, encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    wanted = {f"cpu{c}" for c in cpus}
    busy = total = 0.0
    seen = 0
    for line in lines:
        parts = line.split()
        if not parts or parts[0] not in wanted:
            continue
        values = [float(x) for x in parts[1:9]]  # user nice system idle iowait irq softirq steal
        idle = values[3] + values[4]
        total += sum(values)
        busy += sum(values) - idle
        seen += 1
    if seen == 0:
        return None
    return busy / tick, total / tick


def pick(ceiling: int, others: float) -> int:
    """Threads for ``ceiling`` cores when other work keeps ``others`` of them busy: the free ones, rounded
    to the nearest whole core, at least 1."""
    return max(1, min(ceiling, int(ceiling - others + 0.5)))


class AutoThreads:
    """The thread count of a run in one process, following the cores other work leaves free.

    ``check()`` is called between inner steps; at most every ``every`` seconds it reads how busy the
    process's cores were since the last reading, less this process's own CPU time, and sets
    ``torch.set_num_threads`` when two readings in a row ask for the same new count (the first reading,
    which covers the run's set-up, decides alone). ``log`` hears each change."""

    def __init__(
        self,
        log: Callable[[str], None] = lambda text: None,
        every: float = 3.0,
        counters: Counters | None = None,
        own: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
        ceiling: int | None = None,
    ) -> None:
        cpus = affinity()
        self.cores = len(cpus)
        self.ceiling = ceiling if ceiling is not None else max(1, min(torch.get_num_threads(), len(cpus)))
        self.counters: Counters = counters if counters is not None else (lambda: read_counters(cpus))
        self.log, self.every, self.own, self.clock = log, every, own, clock
        self.threads = self.ceiling
        self.others = 0.0  # cores other work kept busy over the last reading
        self._last = self._reading()
        self._at = clock()
        self._first = True
        self._wanted: int | None = None

    def _reading(self) -> tuple[float, float, float] | None:
        got = self.counters()
        return None if got is None else (got[0], got[1], self.own())

    def check(self) -> int:
        """Between inner steps: re-read the counters when due, and change the count when asked twice;
        returns the count in effect."""
        if self.ceiling <= 1 or self._last is None:
            return self.threads
        now = self.clock()
        if now - self._at < self.every:
            return self.threads
        reading = self._reading()
        if reading is None:
            return self.threads
        busy, total, own = (b - a for a, b in zip(self._last, reading, strict=True))
        self._last, self._at = reading, now
        if total <= 0:
            return self.threads
        # total: every core's seconds over the window, so total / cores is the window's length
        self.others = max(0.0, busy - own) / (total / self.cores)
        want = pick(self.ceiling, self.others)
        first, self._first = self._first, False
        if want == self.threads:
            self._wanted = None
            return self.threads
        if first or self._wanted == want:
            self.log(
                f"threads: {self.threads} -> {want} (other work kept {self.others:.1f} of "
                f"{self.cores} cores busy)"
            )
            self.threads = want
            torch.set_num_threads(want)
            self._wanted = None
        else:
            self._wanted = want
        return self.threads
