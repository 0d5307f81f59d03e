"""Acceptance: `adloco train` with no arguments, as a user runs it (slow: about 3 minutes on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_embedded_default(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the default uses torch's threads
    p = subprocess.run(
        [sys.executable, "-m", "adloco", "train"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    (run,) = list((tmp_path / "runs").iterdir())
    s = json.loads((run / "summary.json").read_text())
    assert s["final_val_ppl"] < s["initial_val_ppl"] / 5  # far below its starting value
    assert s["trainers_final"] < 4  # merged down
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first = {e["trainer"]: e["request"] for e in events if e["event"] == "trainer" and e["round"] == 1}
    assert max(int(b) for b in s["requests_final"].values()) > max(first.values())  # requests grew
    assert any(e["event"] == "worker" and e["accum"] > 1 for e in events)  # switch mode accumulated
    assert (run / "model" / "config.json").is_file()
    plots = {p.name for p in (run / "plots").glob("*.png")}
    assert {"val_ppl_vs_round.png", "val_ppl_vs_bytes.png", "requests.png", "trainers_alive.png"} <= plots
    assert len(plots) == 10
