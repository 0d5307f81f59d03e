"""A round's steps under torch.profiler (``logging.trace``): where the time of a step goes.

Writes the Chrome trace (open it in Perfetto or chrome://tracing) and a summary a person reads: host
and device milliseconds per step, how often the host read a value off the device (``.item()``,
``float()``, ``bool()`` of a tensor: each waits for the device to catch up) and the device-to-host
copies and explicit synchronizations, and the operators that take the most host and device time.
``benchmarks/gpu.py`` makes the same summary of a plain PyTorch loop at the same shape, so the two can
be read side by side.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# what makes the host wait for the device
HOST_READS = ("aten::_local_scalar_dense",)  # .item(), float(t), bool(t), t.tolist() of device values
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
DTOH = ("Memcpy DtoH",)


@dataclass
class Trace:
    """What :func:`profiled` recorded: the profiler and the wall time of the block."""

    steps: int
    wall_s: float = 0.0
    prof: Any = None
    summary: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def profiled(steps: int, device: torch.device) -> Iterator[Trace]:
    """Profile the block (``steps`` inner steps of it): CPU activity, and CUDA's on a CUDA device. The
    device is synchronized at both ends, so the wall time holds everything the block queued."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    out = Trace(steps)
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities, record_shapes=False) as prof:
        t0 = time.perf_counter()
        yield out
        if cuda:
            torch.cuda.synchronize(device)
        out.wall_s = time.perf_counter() - t0
    out.prof = prof
    out.summary = summarize(prof, steps, out.wall_s)


def summarize(prof: Any, steps: int, wall_s: float, top: int = 12) -> dict[str, Any]:
    """Per step: wall (host) ms, device busy ms (the sum of the device's own operator time), host reads of
    device values, synchronizations and device-to-host copies; the ``top`` operators by self host time
    and by self device time (ms per step)."""
    rows = list(prof.key_averages())
    n = max(1, steps)

    def dev_us(e: Any) -> float:
        return float(
            getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0) or 0.0
        )

    def count(names: tuple[str, ...]) -> int:
        return sum(int(e.count) for e in rows if any(e.key.startswith(x) for x in names))

    # A kernel and the operator that launched it both carry its device time: count the device's own rows
    # (kernels, copies, fills: no host time of their own).
    device_us = sum(dev_us(e) for e in rows if float(e.self_cpu_time_total) == 0.0)

    def table(key: Any) -> list[dict[str, Any]]:
        best = sorted(rows, key=key, reverse=True)[:top]
        return [
            {
                "op": e.key[:80],
                "calls_per_step": round(e.count / n, 2),
                "host_ms_per_step": round(float(e.self_cpu_time_total) / 1e3 / n, 3),
                "device_ms_per_step": round(dev_us(e) / 1e3 / n, 3),
            }
            for e in best
            if key(e) > 0
        ]

    return {
        "steps": steps,
        "wall_ms_per_step": round(wall_s * 1e3 / n, 3),
        "device_ms_per_step": round(device_us / 1e3 / n, 3),
        "host_reads_per_step": round(count(HOST_READS) / n, 2),
        "syncs_per_step": round(count(SYNCS) / n, 2),
        "dtoh_copies_per_step": round(count(DTOH) / n, 2),
        "aten_ops_per_step": round(sum(int(e.count) for e in rows if e.key.startswith("aten::")) / n, 1),
        "top_by_host": table(lambda e: float(e.self_cpu_time_total)),
        "top_by_device": table(dev_us),
    }


def markdown(summary: dict[str, Any], title: str) -> str:
    """The summary as a short Markdown page."""
    s = summary
    lines = [
        f"# {title}",
        "",
        f"{s['steps']} steps: {s['wall_ms_per_step']} ms of wall time a step, the device busy "
        f"{s['device_ms_per_step']} ms of it; per step {s['host_reads_per_step']} host reads of device values "
        f"(.item(), float(), bool()), {s['syncs_per_step']} synchronizations, {s['dtoh_copies_per_step']} "
        f"device-to-host copies, {s['aten_ops_per_step']} aten operators.",
    ]
    for key, what in (("top_by_host", "host"), ("top_by_device", "device")):
        lines += [
            "",
            f"## Operators by self {what} time",
            "",
            "| op | calls a step | host ms a step | device ms a step |",
        ]
        lines.append("|---|---|---|---|")
        for r in s[key]:
            op = r["op"].replace("|", "\\|")
            lines.append(
                f"| `{op}` | {r['calls_per_step']} | {r['host_ms_per_step']} | {r['device_ms_per_step']} |"
            )
    return "\n".join(lines) + "\n"


def write(trace: Trace, folder: Path, name: str, title: str) -> None:
    """``<name>.json`` (the Chrome trace), ``<name>.summary.json`` and ``<name>.md`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    trace.prof.export_chrome_trace(str(folder / f"{name}.json"))
    (folder / f"{name}.summary.json").write_text(json.dumps(trace.summary, indent=1) + "\n")
    (folder / f"{name}.md").write_text(markdown(trace.summary, title))
