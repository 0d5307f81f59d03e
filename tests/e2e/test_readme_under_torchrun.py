"""The README's programs for your own loop run exactly as written under torchrun (2 processes), as a user
would launch them (in one process: tests/unit/test_readme_programs.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import readme_programs


@pytest.mark.parametrize("index", [0, 1], ids=["diloco-hooked", "adloco-step-all"])
def test_a_readme_program_runs_as_written_under_torchrun(index: int, tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(readme_programs()[index])
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=240,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    if (
        index == 0
    ):  # two workers: 2 x 3200 examples, Δ all-reduced every round (the ranks' lines may interleave)
        got = sorted(re.findall(r"rank (\d): 5 rounds, 6400 examples, (\d+) bytes", p.stdout))
        assert [r for r, _ in got] == ["0", "1"] and got[0][1] == got[1][1] and int(got[0][1]) > 0
    else:  # four workers, two per process; rank 0 alone prints; each process saved its part
        assert p.stdout.count("round ") == 6 and "merged [0, 1]" in p.stdout
        assert sorted(f.name for f in tmp_path.glob("adloco-state-*.pt")) == [
            "adloco-state-0.pt",
            "adloco-state-1.pt",
        ]
