"""Metrics sinks: a do-nothing base and JSONL (one event a line), and the reader for it."""

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


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Events of a metrics.jsonl; a torn last line (a killed run) is skipped."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
