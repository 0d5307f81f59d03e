"""adloco's Trainer callbacks under torchrun with 2 processes (gloo, 127.0.0.1), as the libraries run
there: accelerate and Lightning join the group, shard the data and wrap the model in DDP. One launch checks
both trainers: DiLoCo's rounds ran, the replicas agree after the last one, and a run resumed from the middle
checkpoint ends bit for bit where the uninterrupted one did, on both processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integrations_common import STEPS, H

ROOT = Path(__file__).resolve().parents[2]


def test_hf_and_lightning_callbacks_save_and_resume_under_torchrun(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
        str(ROOT / "tests" / "integration" / "integrations_worker.py"), str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    lines = [json.loads(x[7:]) for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert [x["trainer"] for x in lines] == ["hf", "lightning"], p.stdout
    for x in lines:
        assert x["world"] == 2 and x["rounds"] == STEPS // H and x["trained"], x
        assert x["replicas_equal_at_end"] and x["resumed_equal_everywhere"], x
        assert x["bytes"] > 0 and x["apart_before_last_sync"] > 1e-4, x
