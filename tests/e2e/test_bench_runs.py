"""``adloco bench`` for real, as a user runs it: variants of tiny runs in processes of their own, two at a
time, over two seeds, stopped part-way and resumed, and what it writes (runs, results.json, report.md) and benchmarks/claims.py reads.
Its planning, selection, ablations and reports are tested with a fake training command
(tests/unit/test_bench.py), and every variant's config, ablations included, resolves
(tests/unit/test_configs.py): here two methods are enough to run the real thing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.helpers import with_faults

ROOT = Path(__file__).resolve().parents[2]


def tiny_bench(tmp_path: Path, corpus: Path) -> Path:
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "model": {"name": "llama-micro"},
                "data": {"source": str(corpus), "tokenizer": "bpe:300", "seq_len": 16},
                "algorithm": {"inner_steps": 2},
                "batch": {"initial": 2},
                "switch": {"b_max": 2},
                "eval": {"max_examples": 8},
                "logging": {"plots": False, "save_model": False},
                "checkpoint": {"every": 0},
                "bench": {"budget": 64, "methods": {"diloco": {"outer.lr": 0.5}}},
            }
        )
    )
    return cfg


def test_a_bench_of_two_methods_over_two_seeds_stopped_and_resumed(tmp_path: Path, text_corpus: Path) -> None:
    """The bench's first go has every run get SIGTERM in the middle of round 2 (as a scheduler stops a job):
    each writes a checkpoint (at checkpoint.every 0 too) and the bench ends with them unfinished; the same
    command with --resume continues each in its own folder (`adloco train --resume`, which replays the
    stopped round exactly: tests/integration/test_faults.py) and the bench finishes."""
    cfg = tiny_bench(tmp_path, text_corpus)
    out = tmp_path / "cmp"
    cmd = [sys.executable, "-m", "adloco", "bench", "--config", str(cfg), "--methods", "adloco,diloco"]
    cmd += ["--seeds", "0,1", "--jobs", "2", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run(
        cmd, capture_output=True, text=True, env=with_faults(env, "term@0:2:1"), timeout=300
    )
    assert first.returncode == 1, first.stderr
    stopped = sorted((out / "runs").iterdir())
    assert len(stopped) == 4 and all(
        (d / "checkpoints").is_dir() and not (d / "summary.json").exists() for d in stopped
    )
    p = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert (
        sorted(p.stdout.count(f"continued: {d.name} from its checkpoint round-") for d in stopped) == [1] * 4
    )
    assert sorted((out / "runs").iterdir()) == stopped  # each finished in its own folder
    assert "[4/4]" in p.stdout and " left" in p.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [0, 1] and not results["failed"] and results["compute"]["mode"] == "examples"
    assert set(results["variants"]) == {"adloco", "diloco"}
    runs = {v: results["variants"][v]["runs"] for v in results["variants"]}
    assert all([r["seed"] for r in rs] == [0, 1] for rs in runs.values())
    spans = sorted((r["started"], r["finished"]) for rs in runs.values() for r in rs)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))  # two ran at once
    folders = {(v, r["seed"]): out / r["run"] for v, rs in runs.items() for r in rs}
    summaries = {k: json.loads((d / "summary.json").read_text()) for k, d in folders.items()}
    assert all(s["examples_total"] >= 64 for s in summaries.values())  # every variant spent the budget
    assert len({s["initial_val_ppl"] for s in summaries.values()}) == 2  # two seeds: two initial models
    cfgs = {k: yaml.safe_load((d / "config.yaml").read_text()) for k, d in folders.items()}
    assert {c["runtime"]["threads"] for c in cfgs.values()} == {1}
    assert cfgs[("diloco", 0)]["outer"]["lr"] == 0.5 and cfgs[("adloco", 1)]["merge"]["policy"] != "none"
    assert len({c["algorithm"]["rounds"] for c in cfgs.values()}) == 1  # one schedule for all
    text = (out / "report.md").read_text()
    assert "| diloco | diloco | outer.lr=0.5 | 2 |" in text  # pinned by bench.methods: shown, not "preset"
    assert "| adloco | adloco | preset | 2 |" in text and "ms per example" in text
    assert "## Grid of diloco" not in text and "## Every run" in text
    # benchmarks/claims.py reads the same results.json: one ratio per seed both variants ran
    claims = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "claims.py"), str(out / "results.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert claims.returncode == 0, claims.stderr
    row = next(x for x in claims.stdout.splitlines() if x.startswith("| lower final perplexity than DiLoCo"))
    assert row.endswith(("| 2 | confirmed |", "| 2 | refuted |", "| 2 | mixed |"))
    merged = next(x for x in claims.stdout.splitlines() if x.startswith("| merging helps"))
    assert merged.endswith("| 0 | not shown |")  # no ablation in this bench
