"""Where ``adloco train`` runs, the first thing a run builds (after :func:`adloco.config.checks.check_placement`
has checked what the config asks of this machine): every worker in this process (``InProcessComm``), or
this process's workers in torch.distributed's group (joined by :mod:`adloco.engine.dist.join`); the device;
the communicator; and, under torchrun, which rank writes the run directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adloco.config import Config
from adloco.config.checks import uses_cuda
from adloco.engine.checkpoint.files import Folder
from adloco.engine.dist import env, join
from adloco.engine.threads import AutoThreads
from adloco.errors import UserError
from adloco.library.comm.base import Comm


def resolve_device(name: str) -> torch.device:
    """``runtime.device`` as this process's device: ``auto`` is CUDA when a device is available."""
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("config: runtime.device = 'cuda': no CUDA device is available (use 'auto' or 'cpu')")
    return torch.device("cuda" if uses_cuda(name) else "cpu")


def backend_of(cfg: Config) -> str:
    """``runtime.backend``, with ``auto`` resolved: torchdist under torchrun (or ``--nproc``), else inprocess."""
    if cfg.runtime.backend == "auto":
        return "torchdist" if env.launched_by_torchrun() else "inprocess"
    return cfg.runtime.backend


@dataclass
class Placement:
    """The config as placed (``algorithm.workers``: as many as the process group holds, which a restart
    may change), the communicator, the device, the process group (None in one process) and what
    torchrun's elastic agent said about the run (None without restarts)."""

    cfg: Config
    comm: Comm
    device: torch.device
    ctx: join.DistContext | None
    elastic: dict[str, Any] | None
    threads: AutoThreads | None = None  # runtime.threads 0 in one process: the cores free of other work

    @property
    def root(self) -> bool:
        """Whether this process writes the run directory and prints progress."""
        return self.comm.rank == self.comm.root

    def close(self) -> None:
        """Leave the process group (after a run that finished: a group that lost a member is left to the
        process's exit, never waited on)."""
        if self.ctx is not None:
            self.ctx.close()


def place(cfg: Config, resume: tuple[Path, Folder | Path] | None) -> Placement:
    """Join the process group the launch asks for (or none), pick the device; under torchrun the rank whose
    disk holds the run (a restart may have given it any rank) is elected to write it."""
    from adloco.engine import rundir
    from adloco.library.comm.inprocess import InProcessComm

    elastic = env.elastic_launch()
    rt = cfg.runtime
    if backend_of(cfg) != "torchdist":
        device = resolve_device(rt.device)
        auto = None
        if rt.threads:
            torch.set_num_threads(rt.threads)
        elif device.type == "cpu":
            auto = AutoThreads()  # adloco.engine.threads: why the count follows the free cores
        return Placement(cfg, InProcessComm(cfg.algorithm.workers), device, None, elastic, auto)
    ctx = join.start(
        rt.workers_per_process,
        rt.device,
        rt.threads,
        cfg.elastic.timeout if elastic is not None else rt.timeout,  # a dead peer costs a restart, soon
        rt.dist_backend,
        shards=rt.shards,
    )
    cfg = cfg.replace(algorithm={"workers": ctx.comm.n_workers})
    join.elect_root(ctx, rundir.newest_round(cfg, resume, elastic))
    return Placement(cfg, ctx.comm, ctx.device, ctx, elastic)
