"""Metrics sinks: a do-nothing base and JSONL (one event a line), and the reader for it."""

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
        self.path = path
        self._f = path.open("a", encoding="utf-8")

    def log(self, event: dict[str, Any]) -> None:
        self._f.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Events of a metrics.jsonl; a torn last line (a killed run) is skipped."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


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
