"""Test-only fault injection, driven by the environment (never set it in real runs).

``ADLOCO_TEST_FAULT=kill@R:N`` SIGKILLs rank R at the start of round N; ``stop@R:N`` SIGSTOPs it (a hung
process that neither answers nor dies).
"""

from __future__ import annotations

import os
import signal

ENV = "ADLOCO_TEST_FAULT"


def inject(rank: int, round_: int) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    action, _, where = spec.partition("@")
    r, _, n = where.partition(":")
    if int(r) == rank and int(n) == round_:
        os.kill(os.getpid(), {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}[action])
