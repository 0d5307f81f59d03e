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


SESSION_FILES = [
    "gpu.json",
    "paper.png",
    "rest.tgz",
    "session.json",
    "session.log",
    "session.md",
    "unit-cuda.txt",
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU variant of the session's dry run")
@pytest.mark.timeout(600)
def test_the_gpu_session_dry_run_writes_every_part_and_its_files(tmp_path: Path) -> None:
    """benchmarks/gpu_session.sh with DRY=1: every part starts and ends within its box, and what comes back
    is the few flat files a GPU machine returns (the unit part narrowed to the CPU tests of the choice)."""
    out = tmp_path / "session"
    env = dict(os.environ)
    env.update(DRY="1", PYTHON=sys.executable, UNIT_WORKERS="1", UNIT_SELECT="cuda_graphs_auto")
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_session.sh"), str(out), "500"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == SESSION_FILES
    assert all(p.is_file() and p.stat().st_size < 16 * 2**20 for p in out.iterdir())
    session = json.loads((out / "session.json").read_text())
    parts = session["parts"]
    assert [(k, v["status"]) for k, v in parts.items()] == [
        ("env", "ok"),
        ("unit", "ok"),
        ("default", "ok"),
        ("compile+paper", "ok"),
    ]
    assert " passed" in parts["unit"]["result"] and "failed" not in parts["unit"]["result"]
    assert parts["default"]["cuda_graphs_line"] == "cuda graphs: off (auto: no CUDA)"
    assert parts["compile+paper"]["compile"]["status"] == parts["compile+paper"]["paper"]["status"] == "ok"
    sections = json.loads((out / "gpu.json").read_text())["sections"]
    compiled = sections["compile"]["result"]
    assert compiled["backend"] == "aot_eager"  # a CPU: tracing, no code generated
    for scope in ("blocks", "model"):
        assert (
            compiled["plain"][scope]["compile_s"] is not None and compiled["plain"][scope]["tokens_per_s"] > 0
        )
    assert compiled["plain"]["blocks"]["compiled"] == "2 LlamaDecoderLayer, each on its own"
    for run in ("blocks, cold cache", "blocks, warm cache"):
        assert compiled["engine"][run]["rc"] == 0 and compiled["engine"][run]["tokens_per_s"] > 0
    paper = sections["paper"]["result"]
    assert set(paper["runs"]) == {"AdLoCo", "DiLoCo"}
    for run in paper["runs"].values():
        assert run["rc"] == 0 and len(run["curve"]) == 1 + paper["plan"]["rounds"]
        assert run["bytes_total"] > 0 and run["graphs_line"] == "cuda graphs: off (auto: no CUDA)"
    assert paper["runs"]["AdLoCo"]["overrides"]["batch.test"] == "augmented_inner_product"  # the paper's
    assert (out / "paper.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## 9. The paper's setting (Figure 1)" in (out / "session.md").read_text()
    # the figure again from the results alone, as on a machine where the session had no matplotlib
    again = tmp_path / "again"
    redraw = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu.py"),
            "--draw-paper",
            str(out / "gpu.json"),
            "--out",
            str(again),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert redraw.returncode == 0 and (again / "paper.png").is_file(), redraw.stderr[-2000:]
