"""Metrics sinks: a do-nothing base, JSONL (one event a line, always), TensorBoard (when installed).

Sinks receive each event as the dict of its JSON line (:mod:`adloco.events` defines them).
"""

from __future__ import annotations

import json
import os
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
        import threading

        self.path = path
        self._f = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()  # the checkpoint thread logs too

    def log(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()

    def close(self) -> None:
        self._f.close()


class TensorBoardSink(MetricsSink):
    """Scalars for TensorBoard under ``<run>/tensorboard``: every round's loss, validation metrics (best
    and per trainer), requests, trainers alive, examples, bytes and simulated time, by round."""

    def __init__(self, path: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(path))

    def log(self, event: dict[str, Any]) -> None:
        kind, r = event.get("event"), int(event.get("round", 0))
        add = self.writer.add_scalar
        if kind == "start":
            for k in ("val_ppl", "val_loss", "val_accuracy"):
                if isinstance(event.get(k), (int, float)):
                    add(f"val/{k}", event[k], 0)
        elif kind == "round":
            for k in ("loss", "val_ppl", "val_loss", "val_accuracy"):
                if isinstance(event.get(k), (int, float)):
                    add(f"{'train' if k == 'loss' else 'val'}/{k}", event[k], r)
            for k in (
                "trainers_alive",
                "examples_total",
                "bytes_total",
                "communications_total",
                "sim_total_s",
            ):
                add(f"run/{k}", event[k], r)
            for t, b in event["requests"].items():
                add(f"request/trainer_{t}", b, r)
        elif kind == "eval":
            for k in ("val_ppl", "val_loss", "val_accuracy"):
                if isinstance(event.get(k), (int, float)):
                    add(f"val_by_trainer/{k}/trainer_{event['trainer']}", event[k], r)

    def close(self) -> None:
        self.writer.close()


class Sinks(MetricsSink):
    """Several sinks as one."""

    def __init__(self, *sinks: MetricsSink) -> None:
        self.sinks = sinks

    def log(self, event: dict[str, Any]) -> None:
        for s in self.sinks:
            s.log(event)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def tensorboard_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def make_sink(run_dir: Path, tensorboard: str = "auto") -> MetricsSink:
    """JSONL always; TensorBoard with ``on``, or with ``auto`` when the package is installed."""
    jsonl = JsonlSink(run_dir / "metrics.jsonl")
    if tensorboard == "off" or (tensorboard == "auto" and not tensorboard_available()):
        return jsonl
    return Sinks(jsonl, TensorBoardSink(run_dir / "tensorboard"))


def truncate_after(path: Path, round_: int) -> int:
    """Drop the events of rounds after ``round_`` (and a torn last line), atomically: a resumed run
    continues the file with no round missing or repeated. Returns how many lines were dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if int(event.get("round", 0)) <= round_ and event.get("event") != "end":
            kept.append(line)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write("".join(x + "\n" for x in kept))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return len(lines) - len(kept)
