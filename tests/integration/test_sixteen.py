"""The engine at the most processes this 2-core machine holds: 16 gloo processes of llama-micro, DiLoCo and
AdLoCo through int4 and the sparse topk, each equal to its in-process twin, with the time each round's
collectives took beside what ``adloco simulate`` prices them at (benchmarks/RESULTS.md, "Sixteen
processes"). Slow: sixteen processes import torch on two cores (``-m slow`` selects it). One thread each.

``ADLOCO_SIXTEEN_OUT=FILE`` writes the timings as JSON.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from adloco import netmodel
from tests.helpers import TINY_DIST, S, adloco_process, load_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N = 16
CASES = [
    ("diloco", "int4"),
    ("diloco", "topk"),
    ("adloco", "int4"),
    ("adloco", "topk"),
]


def _rounds(run_dir: Path) -> list[dict[str, Any]]:
    (run,) = list(run_dir.iterdir())
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [e for e in events if e["event"] == "round"]


@pytest.mark.parametrize("method,dtype", CASES, ids=[f"{m}-{d}" for m, d in CASES])
def test_sixteen_processes_give_the_in_process_run(
    tmp_path: Path, text_corpus: Path, method: str, dtype: str
) -> None:
    from adloco.cli import main

    sets = [
        f"algorithm.method={method}",
        f"algorithm.workers={N}",
        f"algorithm.trainers={4 if method == 'adloco' else 1}",
        f"comm.dtype={dtype}",
        f"data.source={text_corpus}",
        "data.val_fraction=0.05",
        "runtime.timeout=600",
    ]
    common = [*TINY_DIST, *S(*sets)]
    inproc, dist = tmp_path / "inproc", tmp_path / "dist"
    assert main(["train", *common, "--set", f"logging.out_dir={inproc}"]) == 0
    p = adloco_process("train", "--nproc", str(N), *common, "--set", f"logging.out_dir={dist}", timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    a, b = load_run(inproc), load_run(dist)
    assert b["rounds"] == a["rounds"] and b["merges"] == a["merges"]
    for key in ("bytes_total", "communications_total", "bytes_by_kind"):
        assert b["summary"][key] == a["summary"][key], key
    for name, ref in a["params"].items():
        assert (b["params"][name] - ref).abs().max().item() < 1e-5, name
    # each round's collectives: measured on loopback (rank 0's time in them) beside the modelled time
    link = netmodel.Link(125e6, 1e-3)  # network.bandwidth and latency's defaults
    timings = [
        {
            "round": e["round"],
            "rows": e["collectives"],
            "measured_s": e["comm_s"],
            "modelled_s": netmodel.comm_seconds(e["collectives"], link.bandwidth, link.latency),
        }
        for e in _rounds(dist)
    ]
    out = os.environ.get("ADLOCO_SIXTEEN_OUT")
    if out:
        path = Path(out)
        got = json.loads(path.read_text()) if path.is_file() else {}
        got[f"{method}-{dtype}"] = timings
        path.write_text(json.dumps(got, indent=1))
    assert all(t["measured_s"] >= 0 for t in timings)
