"""Communicators: the narrow protocol the round is written against, and its backends.

``InProcessComm`` (every worker in one process), ``TorchDistComm`` (torch.distributed's default group:
gloo or NCCL), ``ThreadComm`` (workers in threads of one process, for loops adloco cannot drive).
"""

from adloco.comm.base import Comm, CommFailure, CommRecord, wire_bytes
from adloco.comm.inprocess import InProcessComm
from adloco.comm.threads import Hub, ThreadComm

__all__ = [
    "Comm",
    "CommFailure",
    "CommRecord",
    "Hub",
    "InProcessComm",
    "ThreadComm",
    "TorchDistComm",
    "wire_bytes",
]


def __getattr__(name: str) -> object:
    if name == "TorchDistComm":  # imports torch.distributed only when asked
        from adloco.comm.torchdist import TorchDistComm

        return TorchDistComm
    raise AttributeError(name)
