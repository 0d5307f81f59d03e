"""Test-only fault injection for subprocesses: Python imports this file at start-up when
``tests/faultinject`` is on PYTHONPATH (see ``tests/helpers.py: with_faults``). Nothing in ``src/`` knows.

``ADLOCO_TEST_FAULT`` holds comma-separated faults:
  ``kill@R:N``   SIGKILL rank R at the start of round N;
  ``stop@R:N``   SIGSTOP it there (a hung process that neither answers nor dies);
  ``term@R:N``   send it SIGTERM there (as a scheduler would), to stop it cleanly;
  ``term@R:N:S`` send it SIGTERM after inner step S of round N (mid-round; ``int@R:N:S``: SIGINT).
They strike the first attempt only, not the processes an elastic agent restarts. And one gate:
  ``hold@N:FILE`` every rank of every attempt waits at the start of round N until FILE exists (a test
                 paces a run by the events it has seen, not by the clock); a SIGTERM while it waits (the
                 agent stopping its workers to restart them) ends the process at once.
Faults that need no
lost process (non-finite workers, out of memory, a full disk) are injected in the test's own process
(``tests/helpers.py``).
"""

from __future__ import annotations

import os

SPEC = os.environ.get("ADLOCO_TEST_FAULT", "")


def _faults(kind: str) -> list[list[str]]:
    out = []
    for item in SPEC.split(","):
        action, _, where = item.strip().partition("@")
        if action == kind:
            out.append(where.split(":"))
    return out


def _install() -> None:
    import signal

    from adloco.library import method

    def rank() -> int:
        # a process fault strikes the first attempt only: the processes an elastic agent restarts are spared
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
            return -1
        return int(os.environ.get("RANK", "0"))

    def hold(path: str) -> None:
        import time

        old = signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(128 + signum))
        try:
            while not os.path.exists(path):
                time.sleep(0.1)
        finally:
            signal.signal(signal.SIGTERM, old)

    step_all = method.AdLoCo.step_all

    def faulty_step_all(self, batches, *, stop=False):  # type: ignore[no-untyped-def]
        round_, h = self.round + 1, self.step_in_round
        if h == 0:  # the start of a round
            for n, *path in _faults("hold"):
                if int(n) == round_:
                    hold(":".join(path))
            for action, sig in (("kill", signal.SIGKILL), ("stop", signal.SIGSTOP), ("term", signal.SIGTERM)):
                for r, n, *at in _faults(action):
                    if int(r) == rank() and int(n) == round_ and not at:
                        os.kill(os.getpid(), sig)
        out = step_all(self, batches, stop=stop)
        for action, sig in (("term", signal.SIGTERM), ("int", signal.SIGINT)):
            for r, n, *at in _faults(action):
                if int(r) == rank() and int(n) == round_ and at and int(at[0]) == h + 1:
                    os.kill(os.getpid(), sig)
        return out

    method.AdLoCo.step_all = faulty_step_all


if SPEC:
    _install()
