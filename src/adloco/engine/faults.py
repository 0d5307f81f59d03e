"""Test-only fault injection, driven by the environment (never set it in real runs).

``ADLOCO_TEST_FAULT`` holds comma-separated faults:
  ``kill@R:N``   SIGKILL rank R at the start of round N;
  ``stop@R:N``   SIGSTOP it there (a hung process that neither answers nor dies);
  ``term@R:N``   send it SIGTERM there (as a scheduler would), to stop it cleanly;
  ``term@R:N:S`` send it SIGTERM after its S-th inner step of round N (mid-round; ``int@R:N:S``: SIGINT);
  ``nan@W:N``    worker W's parameters become non-finite in round N (``nan@W:N-M``: rounds N to M);
  ``oom@W:B``    worker W runs out of memory on any micro-batch of more than B rows;
  ``diskfull@N`` the checkpoint of round N meets a full disk.
"""

from __future__ import annotations

import os
import signal

ENV = "ADLOCO_TEST_FAULT"


def _faults(kind: str) -> list[list[str]]:
    out = []
    for item in os.environ.get(ENV, "").split(","):
        action, _, where = item.strip().partition("@")
        if action == kind:
            out.append(where.split(":"))
    return out


def inject(rank: int, round_: int) -> None:
    """Process faults at the start of round ``round_`` (1-based)."""
    for action, sig in (("kill", signal.SIGKILL), ("stop", signal.SIGSTOP), ("term", signal.SIGTERM)):
        for r, n, *at in _faults(action):
            if int(r) == rank and int(n) == round_ and not at:
                os.kill(os.getpid(), sig)


def after_step(rank: int, round_: int, step: int) -> None:
    """Process faults after this process's ``step``-th inner step (1-based) of round ``round_``."""
    for action, sig in (("term", signal.SIGTERM), ("int", signal.SIGINT)):
        for r, n, *at in _faults(action):
            if int(r) == rank and int(n) == round_ and at and int(at[0]) == step:
                os.kill(os.getpid(), sig)


def poisoned(worker: int, round_: int) -> bool:
    for w, span in _faults("nan"):
        lo, _, hi = span.partition("-")
        if int(w) == worker and int(lo) <= round_ <= int(hi or lo):
            return True
    return False


def oom_rows(worker: int) -> int | None:
    for w, rows in _faults("oom"):
        if int(w) == worker:
            return int(rows)
    return None
