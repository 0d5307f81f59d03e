"""benchmarks/gpu.py: the dry run (tiny sizes) writes its JSON and Markdown with every section present.

On a machine without CUDA the CUDA-only parts record themselves as skipped; the CUDA test runs the same
dry run on a GPU and checks that the mixed-precision runs, the b_max search and the CUDA-only
approaches did run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {"env", "precision", "b_max", "oom", "torchrun", "overhead", "multi"}


def _dry_run(out: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--dry-run", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=270,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu.json").read_text())
    assert set(report["sections"]) == SECTIONS
    md = (out / "gpu.md").read_text()
    for s in report["sections"].values():
        assert s["title"] in md
    assert (out / "gpu.log").is_file()
    return report


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant of the dry run")
def test_dry_run_on_cpu(tmp_path: Path) -> None:
    report = _dry_run(tmp_path)
    sections = report["sections"]
    for name, s in sections.items():
        assert s["status"] in ("ok", "skipped"), (name, s.get("error"))
    assert sections["b_max"]["status"] == sections["oom"]["status"] == "skipped"
    prec = sections["precision"]["result"]["runs"]
    assert prec["fp32"]["rc"] == 0 and prec["fp32"]["summary"]["final_val_ppl"] > 0
    assert prec["fp16"]["rc"] == 2 and "needs CUDA" in prec["fp16"]["error"]  # refused in one line
    multi = sections["multi"]["result"]
    # the engine's workers, one after another (at once needs CUDA), and the CLI refusing cuda_graphs
    engine = multi["engine"]["shapes"]["llama-micro"]
    assert engine["sequential"]["2"]["examples_per_s"] > 0 and engine["graphs"]["2"] == {
        "skipped": "CUDA only"
    }
    assert multi["cli"]["rc"] == 2 and "CUDA graphs need CUDA" in multi["cli"]["error"]
    assert multi["micro"]["checks"]["stacked_vs_separate"]["param_rel_err"] < 1e-4  # vmap'd = separate
    overhead = sections["overhead"]["result"]
    assert overhead["engine"]["tokens_per_s"] > 0
    # both traced: the engine's round (logging.trace) and the plain loop, read side by side
    assert overhead["engine"]["trace"]["wall_ms_per_step"] > 0
    assert overhead["plain_trace"]["summary"]["aten_ops_per_step"] > 0
    # runtime.compile on a CPU: the unit tier's (tests/unit/test_gpu_paths.py), not the dry run's
    assert overhead["engine_compiled"] == {"skipped": "CUDA only"}
    assert "engine | plain loop" in (tmp_path / "gpu.md").read_text()
    assert sections["env"]["result"]["cuda"] is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dry_run_on_cuda(tmp_path: Path) -> None:
    report = _dry_run(tmp_path)
    sections = report["sections"]
    assert sections["env"]["result"]["cuda"] is True
    for prec in ("fp32", "bf16", "fp16"):
        run = sections["precision"]["result"]["runs"][prec]
        assert run["rc"] == 0, run.get("output_tail")
        assert "b_max_search" in run  # the CUDA search ran and logged its line
    multi = sections["multi"]["result"]
    assert multi["engine"]["check"]["theta_rel_diff"] < 1e-2  # graphs against none (bf16, another optimizer)
    engine = next(iter(multi["engine"]["shapes"].values()))
    assert engine["graphs"]["2"]["examples_per_s"] > 0 and "capture_failed" not in engine["graphs"]["2"]
    assert multi["cli"]["rc"] == 0
    assert multi["micro"]["checks"]["graph_vs_eager"]["param_rel_err"] < 1e-3
    overhead = sections["overhead"]["result"]
    assert overhead["engine"]["trace"]["device_ms_per_step"] > 0
