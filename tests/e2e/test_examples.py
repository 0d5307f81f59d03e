"""The examples run as the README writes them, and their validation loss falls."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def run(cmd: list[str]) -> str:
    p = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    return p.stdout


def losses(out: str) -> tuple[float, float]:
    m = re.search(r"validation loss ([\d.]+) -> ([\d.]+)", out)
    assert m, out
    return float(m.group(1)), float(m.group(2))


def test_diloco_in_your_own_loop() -> None:
    """In one process (under torchrun, the README's DiLoCo program covers the same hooked form)."""
    out = run([sys.executable, "examples/diloco_own_loop.py"])
    before, after = losses(out)
    assert after < before - 1.0
    assert "workers 2" not in out


def test_your_own_outer_optimizer_in_its_own_file() -> None:
    """A Muon-style outer step written in the example's file, through Outer(optimizer=...): the loss falls
    and its momentum is what the checkpoint keeps."""
    out = run([sys.executable, "examples/outer_optimizer.py"])
    before, after = losses(out)
    assert after < before - 1.0
    assert "outer state kept for checkpoints: ['momentum_buffer']" in out


def test_adloco_in_your_own_loop_in_one_process_and_under_torchrun() -> None:
    """Two workers in one process, and one in each of two processes: the same rounds, requests and
    merges, and parameters equal to within float32 rounding."""
    script = "examples/adloco_own_loop.py"
    one = run([sys.executable, script])
    two = run([*TORCHRUN, script])
    for out in (one, two):
        before, after = losses(out)
        assert after < before - 1.0
        assert "merged [0, 1]" in out
    rounds = [re.findall(r"round \d+: requests \{[^}]*\}", out) for out in (one, two)]
    assert rounds[0] == rounds[1] and len(rounds[0]) == 6
    sums = [float(re.search(r"parameter checksum ([\d.]+)", out).group(1)) for out in (one, two)]  # type: ignore[union-attr]
    assert sums[0] == pytest.approx(sums[1], rel=1e-5)


def test_diloco_with_workers_sharded_by_fsdp2_in_your_own_loop() -> None:
    """2 workers x 2 shards under torchrun: a model wrapped with fully_shard, the user's AdamW on its
    DTensor parameters, `with algo:`; the rounds ran and the loss fell."""
    out = run([*TORCHRUN[:-1], "4", "examples/diloco_fsdp.py"])
    before, after = losses(out)
    assert after < before - 1.0
    assert "workers 2 x 2 shards, rounds 10" in out


@pytest.mark.parametrize("launcher", ["python", "torchrun"])
def test_diloco_under_a_hugging_face_trainer(launcher: str) -> None:
    """Two workers, each an unmodified Trainer (in threads, or in processes under torchrun): DiLoCo's rounds
    ran, the replicas trained apart between syncs (no DDP, each on its own data) and agree after the last."""
    script = "examples/hf_trainer.py"
    out = run([sys.executable, script] if launcher == "python" else [*TORCHRUN, script])
    before, after = losses(out)
    assert after < before - 1.0
    where = "threads" if launcher == "python" else "processes"
    assert f"workers 2 ({where}), rounds 6 of 20 steps" in out
    m = re.search(r"before the last sync ([\d.e+-]+), after it ([\d.e+-]+)", out)
    assert m, out
    assert float(m.group(1)) > 1e-4  # DDP, or the same data on both workers, would keep them equal
    assert float(m.group(2)) < 1e-6


@pytest.mark.parametrize("launcher", ["python", "torchrun"])
def test_diloco_under_a_lightning_trainer(launcher: str) -> None:
    """One worker in one process, and two under torchrun as the guide runs it (each rank exits 0: only rank 0
    holds the checkpoint folder): DiLoCo's rounds ran with Lightning's checkpoints, and the loss fell."""
    script = "examples/lightning_trainer.py"
    out = run([sys.executable, script] if launcher == "python" else [*TORCHRUN, script])
    before, after = losses(out)
    assert after < before - 1.0
    workers = 1 if launcher == "python" else 2
    assert f"workers {workers}, rounds 6 of 20 steps" in out and "step=60.ckpt" in out
