"""Acceptance: `adloco train` on the embedded default, as a user runs it on a fresh machine (a cold token
cache: the standard library read, a BPE tokenizer trained, every file tokenized), cut to one round so that
CI can afford it; everything the run writes. What only this run shows is here: the default corpus,
tokenizer and model end to end, and how far the default learns in one round. The rest of a run's shape is
covered by shorter runs: merges (the default's first is at round 2) and every event in the CLI's own run
(tests/e2e/test_cli.py, merging every round) and tests/unit; the whole demo's numbers are the README's,
from the command it gives. One thread, as every process of the slow tiers (the demo's numbers are from
``runtime.threads=1`` too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_embedded_default(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ADLOCO_CACHE": str(tmp_path / "cache")}  # cold cache
    p = subprocess.run(
        [sys.executable, "-m", "adloco", "train", "--set", "algorithm.rounds=1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "training a byte-level BPE tokenizer (up to 4096 tokens)" in p.stdout
    assert "tokenizer: a vocabulary of 4096 tokens" in p.stdout
    assert "llama-tiny, 1.38M parameters, 4 workers, 4 trainers" in p.stdout
    (run,) = list((tmp_path / "runs").iterdir())
    s = json.loads((run / "summary.json").read_text())
    assert s["method"] == "adloco" and s["rounds"] == 1
    assert s["final_val_ppl"] < s["initial_val_ppl"] / 2  # far below its starting value
    assert s["trainers_final"] == 4  # the default merges every 2 rounds
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first = {e["trainer"]: e["request"] for e in events if e["event"] == "trainer" and e["round"] == 1}
    assert max(int(b) for b in s["requests_final"].values()) > max(first.values())  # requests grew
    assert (run / "model" / "config.json").is_file() and (run / "model" / "tokenizer.json").is_file()
    assert (run / "checkpoints" / "round-000001" / "state.json").is_file()
    plots = {p.name for p in (run / "plots").glob("*.png")}
    assert {"val_ppl_vs_round.png", "val_ppl_vs_bytes.png", "requests.png", "trainers_alive.png"} <= plots
    assert len(plots) == 10
