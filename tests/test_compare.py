"""`adloco report` on recorded run directories made here by hand, and `adloco bench` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from adloco import compare
from adloco.cli import main


def recorded_run(root: Path, name: str, method: str, ppls: list[float], bytes_per_round: int) -> Path:
    """A run directory as `adloco train` writes it: 2 workers, one Δ all-reduce a round, 1 s of compute."""
    run = root / name
    run.mkdir(parents=True)
    cfg = {
        "algorithm": {"method": method, "trainers": 1, "workers": 2},
        "batch": {"eta": 0.5},
        "network": {"bandwidth": 1e6, "latency": 0.01},
        "runtime": {"worker_speeds": []},
        "logging": {"name": name},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    events: list[dict] = [
        {"event": "start", "round": 0, "trainers": 1, "val_ppl": 100.0, "task": "causal_lm"}
    ]
    for r, ppl in enumerate(ppls, 1):
        for w in (0, 1):
            events.append(
                {"event": "worker", "round": r, "worker": w, "compute_s": 1.0 + w, "effective": 4, "accum": 1}
            )
        events.append(
            {
                "event": "trainer",
                "round": r,
                "trainer": 0,
                "workers": [0, 1],
                "request": 4 * r,
                "request_next": 4 * r + 4,
                "sigma2": 8.0,
                "gbar_sq": 1.0,
            }
        )
        events.append(
            {
                "event": "round",
                "round": r,
                "trainers_alive": 1,
                "allocation": {"0": 0, "1": 0},
                "examples_total": 100 * r,
                "communications_total": r,
                "bytes_total": bytes_per_round * r,
                "collectives": [["delta", "all_reduce", 2, bytes_per_round // 2, 1]],
                "val_ppl": ppl,
            }
        )
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    (run / "summary.json").write_text(json.dumps({"wall_s": 10.0, "peak_memory_bytes": 2_000_000}))
    return run


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    return [
        recorded_run(tmp_path, "fast", "adloco", [50.0, 30.0, 20.0], 2_000_000),
        recorded_run(tmp_path, "slow", "diloco", [80.0, 60.0, 40.0], 4_000_000),
    ]


def test_simulated_time_and_the_target(runs: list[Path]) -> None:
    fast = compare.load(runs[0])
    # a round: slowest worker 2 s + all-reduce of 1 MB among 2: 2·1/2 · 1e6/1e6 + 2 · 0.01 = 1.02 s
    assert [p[4] for p in fast.points] == pytest.approx([0, 3.02, 6.04, 9.06])
    assert compare.reach(fast, 30.0) == {
        "round": 2,
        "examples": 200,
        "communications": 2,
        "bytes": 4_000_000,
        "sim_s": pytest.approx(6.04),
    }
    assert compare.reach(fast, 10.0) is None
    # priced for another network without re-running: 10x the bandwidth
    assert compare.load(runs[0], bandwidth=1e7).points[1][4] == pytest.approx(2 + 0.1 + 0.02)


def test_theorem_1_bound(runs: list[Path]) -> None:
    # σ²/(M η² (‖g‖² + σ²/(M b))) with σ² = 8, ‖g‖² = 1, M = 2, η = 0.5, b = 4: 8/(0.5 (1 + 1)) = 8
    (first, *_) = compare.theorem1(compare.load(runs[0]))
    assert first == (1, 0, pytest.approx(8.0), 8)


def test_report_command(runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    assert main(["report", *map(str, runs), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "Target perplexity: **40.00**" in text  # the highest final perplexity
    rows = [line for line in text.splitlines() if line.startswith("| fast") or line.startswith("| slow")]
    assert rows[0].startswith("| fast | adloco | 3 | 20.00 | 200 | 2 | 4.0 MB | 6.0 s |")
    assert rows[1].startswith("| slow | diloco | 3 | 40.00 | 300 | 3 | 12.0 MB |")
    for name in (
        "val_ppl_vs_examples",
        "val_ppl_vs_communications",
        "val_ppl_vs_bytes",
        "val_ppl_vs_simulated_time",
        "requests",
        "trainers_alive",
        "allocation",
        "batch",
    ):
        assert (out / "plots" / f"{name}.png").stat().st_size > 1000
        assert f"plots/{name}.png" in text


def test_report_refuses_a_folder_that_is_not_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"adloco: error: run directory '{tmp_path}': no config.yaml (not a run directory)"
    )


def test_bench_end_to_end(tmp_path: Path, text_corpus: Path) -> None:
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"name": "llama-micro"},
                "data": {"source": str(text_corpus), "tokenizer": "bpe:300", "seq_len": 16},
                "algorithm": {"inner_steps": 2},
                "batch": {"initial": 2},
                "switch": {"b_max": 2},
                "eval": {"max_examples": 8},
                "logging": {"plots": False, "save_model": False},
                "checkpoint": {"every": 0},
                "bench": {"budget": 96, "methods": {"diloco": {"outer.lr": 0.5}}},
            }
        )
    )
    out = tmp_path / "cmp"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "adloco",
            "bench",
            "--config",
            str(cfg),
            "--methods",
            "adloco,diloco,ddp",
            "--ablations",
            "no-merge",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    runs = sorted((out / "runs").iterdir())
    assert [r.name.rsplit("-", 2)[0] for r in runs] == ["adloco", "adloco-no-merge", "ddp", "diloco"]
    summaries = {r.name.rsplit("-", 2)[0]: json.loads((r / "summary.json").read_text()) for r in runs}
    assert all(s["examples_total"] >= 96 for s in summaries.values())  # every variant spent the budget
    assert len({s["initial_val_ppl"] for s in summaries.values()}) == 1  # same model, data and seed
    assert summaries["diloco"]["method"] == "diloco" and summaries["ddp"]["bytes_by_kind"].get("grad", 0) > 0
    cfgs = {r.name.rsplit("-", 2)[0]: yaml.safe_load((r / "config.yaml").read_text()) for r in runs}
    assert cfgs["diloco"]["outer"]["lr"] == 0.5 and cfgs["adloco-no-merge"]["merge"]["policy"] == "none"
    assert len({c["algorithm"]["rounds"] for c in cfgs.values()}) == 1  # one schedule for all
    text = (out / "report.md").read_text()
    assert text.count("\n| ") == 5  # the header and four variants
    assert "adloco bench --config" in text


def test_bench_checks_every_variant_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    code = main(["bench", "--budget", "10", "--methods", "adloco,fedavg", "--out", str(out)])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err.strip() == (
        "adloco: error: --methods 'adloco,fedavg': 'fedavg' is not one of adloco, diloco, localsgd, ddp"
    )


def test_report_on_one_run_writes_into_it(runs: list[Path]) -> None:
    assert main(["report", str(runs[0])]) == 0
    assert (runs[0] / "report.md").read_text().count("\n| fast | adloco |") == 1
    assert (runs[0] / "plots" / "val_ppl_vs_round.png").is_file()  # the run's own plots, redrawn
    assert (runs[0] / "plots" / "val_ppl_vs_simulated_time.png").is_file()


def test_report_states_the_network_it_priced(runs: list[Path], tmp_path: Path) -> None:
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "a")]) == 0
    assert "on 1 MB/s and 10 ms latency" in (tmp_path / "a" / "report.md").read_text()
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "b"), "--bandwidth", "1e7"]) == 0
    assert "on 10 MB/s and 10 ms latency" in (tmp_path / "b" / "report.md").read_text()
