"""The README's programs for your own loop run exactly as written under torchrun (2 processes), as a user
would launch them (in one process: tests/unit/test_readme_programs.py). The hooked DiLoCo program runs
there several times: tests/e2e/test_clean_exit.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import readme_programs


def test_the_readme_adloco_program_runs_as_written_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(readme_programs()[1])
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=240,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    # four workers, two per process; rank 0 alone prints; each process saved its part
    assert p.stdout.count("round ") == 6 and "merged [0, 1]" in p.stdout
    assert sorted(f.name for f in tmp_path.glob("adloco-state-*.pt")) == [
        "adloco-state-0.pt",
        "adloco-state-1.pt",
    ]
