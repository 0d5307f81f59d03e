"""SIGINT and SIGTERM during ``adloco train``: a flag the workers read before every inner step, so a run
stops at the end of a step and writes a checkpoint (:class:`adloco.engine.train.Stopped`); the first
signal is acknowledged at once, saying what will happen."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any


class Signals:
    """SIGINT and SIGTERM set :attr:`signum`; the first one counts, later ones are ignored so the
    checkpoint is written whole (SIGKILL still ends everything). ``acknowledge(signum)`` runs at the first
    one, in the handler: a line saying what happens now. Handlers are installed on the main thread only (a
    run in another thread keeps the process's own) and restored on exit."""

    def __init__(self, acknowledge: Callable[[int], None] = lambda signum: None) -> None:
        self.signum: int | None = None
        self.acknowledge = acknowledge
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            self.acknowledge(signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
