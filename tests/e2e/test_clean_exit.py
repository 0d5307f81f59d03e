"""A process that ran collectives exits with status 0, every time.

gloo's worker threads drop a finished collective's tensors after the caller has moved on, and once
``torch._dynamo`` is imported (an optimizer's first step does it) the process group outlives
``destroy_process_group()``: a thread that takes the GIL while the interpreter finalizes aborts the
process ("terminate called without an active exception") after a run that succeeded. The README's
hooked DiLoCo program did so in about one run in three under torchrun before ``adloco.comm.torchdist``
gave those threads a moment at exit. The race is one of timing, so the program runs several times."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import readme_programs


def test_a_program_that_succeeds_exits_with_status_zero_every_time(tmp_path: Path) -> None:
    script = tmp_path / "program.py"
    script.write_text(readme_programs()[0])
    failed = []
    for _ in range(8):
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                str(script),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=240,
        )
        if p.returncode != 0:
            failed.append(p.stderr[-2000:])
    assert not failed, f"{len(failed)} of 8 runs failed:\n{failed[0]}"
