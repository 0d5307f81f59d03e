"""Metrics sinks: a do-nothing base, JSONL (always), and TensorBoard when it is installed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsSink:
    """Receives one event (a flat-ish dict with an ``event`` key) at a time."""

    def log(self, event: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlSink(MetricsSink):
    """``metrics.jsonl``: one event a line, flushed as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = path.open("a", encoding="utf-8")

    def log(self, event: dict[str, Any]) -> None:
        self._f.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class TensorBoardSink(MetricsSink):
    """Round summaries as TensorBoard scalars (only when ``tensorboard`` is importable)."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(str(log_dir))

    def log(self, event: dict[str, Any]) -> None:
        if event.get("event") != "round":
            return
        step = event["round"]
        for key in ("loss", "val_ppl", "val_loss", "trainers_alive", "bytes_total", "examples_total"):
            if isinstance(event.get(key), (int, float)):
                self._w.add_scalar(key, event[key], step)
        for t, b in event.get("requests", {}).items():
            self._w.add_scalar(f"request/trainer{t}", b, step)

    def close(self) -> None:
        self._w.close()


class MultiSink(MetricsSink):
    def __init__(self, sinks: list[MetricsSink]) -> None:
        self.sinks = sinks

    def log(self, event: dict[str, Any]) -> None:
        for s in self.sinks:
            s.log(event)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Events of a metrics.jsonl; a torn last line (a killed run) is skipped."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
