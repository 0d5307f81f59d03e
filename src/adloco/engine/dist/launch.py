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

from adloco.engine.dist.env import LOOPBACK_ENV, NPROC_ENV, PROGRAM_ENV, STORE_ENV, program

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
        NPROC_ENV: str(nproc),
        PROGRAM_ENV: program(),
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


def run_elastic(nproc: int, max_restarts: int, args: Sequence[str]) -> int:
    """``adloco train --nproc N --max-restarts R``: N processes under torch's elastic agent, which restarts
    them (up to R times) when one fails; each restart continues from the run's newest checkpoint.

    The agent is torch.distributed.launcher's (no supervisor of our own). Its rendezvous store and the
    processes' store listen on 127.0.0.1 only: we bind their sockets ourselves and hand them over (torch's
    own servers listen on every interface). Returns 0, the first failure's exit code, or 128 + the signal.
    """
    import logging
    import socket
    import uuid

    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    store = dist.TCPStore(  # noqa: F841 - the rendezvous' store lives as long as this call
        "127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=sock.fileno()
    )
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # the shared store breaks restarts in torch 2.13
    os.environ[LOOPBACK_ENV] = "1"
    os.environ[NPROC_ENV] = str(nproc)
    os.environ[PROGRAM_ENV] = program()
    lo = loopback_interface()
    if lo is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in list(logging.root.manager.loggerDict):  # the agent's own chatter: errors only
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.ERROR)
    run_id = time.strftime("%Y%m%d-%H%M%S")  # the run directory is <name>-<run id>
    with tempfile.TemporaryDirectory(prefix="adloco-elastic-") as logs:
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=nproc,
            run_id=run_id or uuid.uuid4().hex,
            rdzv_backend="c10d",
            rdzv_endpoint=f"127.0.0.1:{port}",
            rdzv_configs={
                "is_host": False,
                "join_timeout": 600,
                "last_call_timeout": 1,
                "close_timeout": 5,
                "keep_alive_interval": 1,
                "keep_alive_max_attempt": 3,
            },
            max_restarts=max_restarts,
            monitor_interval=0.5,
            local_addr="127.0.0.1",
            logs_specs=DefaultLogsSpecs(log_dir=logs, redirects=Std.NONE, tee=Std.NONE),
        )
        old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            elastic_launch(config, sys.executable)("-m", "adloco", *args)
            return 0
        except ChildFailedError as exc:
            _, failure = exc.get_first_failure()
            return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
        except Exception as exc:  # the agent raises SignalException on SIGINT / SIGTERM
            sigval = getattr(exc, "sigval", None)
            if sigval is None:
                raise
            return 128 + int(sigval)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            sock.close()
