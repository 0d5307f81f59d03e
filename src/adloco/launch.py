"""``adloco train --nproc N``: N torch.distributed processes on this machine, reachable from it alone.

The processes meet through a file store in a private temporary folder instead of a TCP rendezvous
(torch's TCP store listens on every network interface), and gloo / NCCL are pinned to the loopback
interface. The launcher forwards SIGINT and SIGTERM to every process, so each stops at the end of its
inner step and the run writes a checkpoint; it returns the first failing process's exit code.
Several machines: use torchrun (see the README), where the rendezvous address is the user's choice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

STORE_ENV = "ADLOCO_STORE"


def loopback_interface() -> str | None:
    """The loopback interface's name ('lo' on Linux, 'lo0' on macOS), if there is one."""
    with contextlib.suppress(OSError, AttributeError):
        for _, name in socket.if_nameindex():
            if name.startswith("lo"):
                return name
    return None


def child_env(rank: int, nproc: int, store: str) -> dict[str, str]:
    env = {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        STORE_ENV: store,
        "ADLOCO_NPROC": str(nproc),
    }
    lo = loopback_interface()
    if lo is not None:
        env.setdefault("GLOO_SOCKET_IFNAME", lo)
        env.setdefault("NCCL_SOCKET_IFNAME", lo)
    return env


def run_local(nproc: int, args: Sequence[str]) -> int:
    """Run ``python -m adloco <args>`` as ``nproc`` ranks; returns 0, the first failure's code, or 128 +
    the signal that stopped the run."""
    with tempfile.TemporaryDirectory(prefix="adloco-store-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            subprocess.Popen([sys.executable, "-m", "adloco", *args], env=child_env(r, nproc, store))
            for r in range(nproc)
        ]
        got: list[int] = []

        def forward(signum: int, frame: object) -> None:
            if got and signum == signal.SIGINT:  # a second Ctrl-C: stop waiting for checkpoints
                for p in procs:
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
            got.append(signum)
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signum)

        old = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            codes: list[int | None] = [None] * nproc
            while any(c is None for c in codes):
                for i, p in enumerate(procs):
                    if codes[i] is None:
                        codes[i] = p.poll()
                time.sleep(0.05)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
    if got:
        return 128 + got[0]
    failed = [c for c in codes if c]
    return (codes[0] or failed[0]) if failed else 0
