"""Communicators: the narrow protocol the round is written against, and its backends.

``InProcessComm`` (every worker in one process), ``TorchDistComm`` (torch.distributed's default group:
gloo or NCCL), ``ThreadComm`` (workers in threads of one process, for loops adloco cannot drive).
"""

import os

from adloco.library.comm.base import Comm, CommFailure, CommRecord, wire_bytes
from adloco.library.comm.inprocess import InProcessComm
from adloco.library.comm.threads import Hub, ThreadComm

__all__ = [
    "Comm",
    "CommFailure",
    "CommRecord",
    "Hub",
    "InProcessComm",
    "ThreadComm",
    "TorchDistComm",
    "default_comm",
    "wire_bytes",
]


def __getattr__(name: str) -> object:
    if name == "TorchDistComm":  # imports torch.distributed only when asked
        from adloco.library.comm.torchdist import TorchDistComm

        return TorchDistComm
    raise AttributeError(name)


def default_comm(n_local: int) -> Comm:
    """torch.distributed's default group when it is initialized, else every worker in this process. A
    launcher that asks for several processes (``WORLD_SIZE`` > 1, as torchrun sets it) with no process
    group is refused: falling back to this process alone would train each process on its own, silently."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from adloco.library.comm.torchdist import TorchDistComm

        return TorchDistComm(n_local)
    world = os.environ.get("WORLD_SIZE", "1")
    if world.strip() != "1":
        raise ValueError(
            f"comm: WORLD_SIZE = {world!r} (a launcher such as torchrun started several processes) but "
            "torch.distributed's process group is not initialized: call "
            "torch.distributed.init_process_group() before building the algorithm, or pass comm= "
            "(adloco.InProcessComm(n) for workers in this process only)"
        )
    from adloco.library.comm.inprocess import InProcessComm

    return InProcessComm(n_local)
