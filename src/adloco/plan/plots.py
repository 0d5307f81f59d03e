"""``adloco simulate --plots``: compute utilization (and goodput, with failures) against the number of
workers and against the links' bandwidth, each a PNG written whole or not at all."""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from adloco.errors import UserError


def draw(s: Any, sim: Any, out: Path) -> list[Path]:
    """Two plots of setup ``s`` into ``out`` (made if missing): ``against-workers.png`` over
    ``sim.sweep_workers``, ``against-bandwidth.png`` over ``sim.sweep_mbits``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from adloco.plan.sim import simulate, sweep

    try:
        out.mkdir(exist_ok=True)
    except OSError as exc:
        raise UserError(f"--plots {str(out)!r}: cannot be made ({exc.strerror})") from None
    label = f"{s.method}, {s.wire.dtype}, H = {s.inner_steps}"
    by_n = sweep(s, workers=list(sim.sweep_workers))
    by_bw = sweep(s, mbits=list(sim.sweep_mbits))
    failing = s.failures.mtbf_s is not None
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    ns = [int(p["workers"]) for p in by_n]
    ax.plot(ns, [100 * p["utilization"] for p in by_n], marker="o", label=f"utilization ({label})")
    if failing:
        good = [100 * simulate(replace(s, workers=n, net=_net(s, n))).goodput for n in ns]
        ax.plot(ns, good, marker="s", label=f"goodput, {s.failures.recovery} recovery")
    ax.set_xscale("log", base=2)
    written.append(
        _finish(
            fig,
            ax,
            "workers N",
            "%",
            f"against N, links {8 * s.net.bandwidth / 1e6:g} Mbit/s",
            out / "against-workers.png",
        )
    )

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["mbits"] for p in by_bw], [100 * p["utilization"] for p in by_bw], marker="o", label=label)
    ax.set_xscale("log")
    title = f"against bandwidth, {s.workers} workers"
    written.append(
        _finish(
            fig, ax, "link bandwidth, Mbit/s", "compute utilization, %", title, out / "against-bandwidth.png"
        )
    )
    return written


def _finish(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    """A utilization plot's axes (0–100%), grid, legend and title; saved to ``path`` and closed."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def _net(s: Any, n: int) -> Any:
    from adloco import netmodel

    net = s.net
    if isinstance(net, netmodel.Network) and len(net.sites) > 1 and sum(net.sites) != n:
        return replace(net, sites=())
    return net


def _save(fig: Any, path: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"{str(path)!r}: cannot be written ({exc.strerror})") from None
    return path
