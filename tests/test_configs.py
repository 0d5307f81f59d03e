"""The ready configs in configs/: they resolve, the default is the default, the paper's says what it needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adloco.config import dump_yaml, resolve
from tests.helpers import coordinator

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize(
    "name", sorted(p.name for p in CONFIGS.glob("*.yaml") if not p.name.startswith("bench"))
)
def test_every_config_resolves(name: str) -> None:
    resolve(CONFIGS / name)


def test_the_bench_config_resolves_for_every_variant() -> None:
    import argparse

    from adloco.bench import ABLATIONS, METHODS, variants

    args = argparse.Namespace(
        config=str(CONFIGS / "bench-cpu.yaml"),
        overrides=[],
        methods=",".join(METHODS),
        ablations=",".join(ABLATIONS),
        budget=None,
        target=None,
    )
    settings, todo = variants(args)
    assert settings["budget"] == 12288 and len(todo) == 7
    for name, sets in todo:
        c = resolve(None, sets, base=settings["raw"])
        assert c.algorithm.budget == 12288 and c.algorithm.rounds == 64, name
    diloco = resolve(None, dict(todo)["diloco"], base=settings["raw"])
    assert (diloco.outer.optimizer, diloco.outer.lr, diloco.algorithm.trainers) == ("nesterov", 0.7, 1)


def test_default_yaml_is_the_embedded_default() -> None:
    assert dump_yaml(resolve(CONFIGS / "default.yaml")) == dump_yaml(resolve())


def test_paper_config_has_the_appendix_settings() -> None:
    c = resolve(CONFIGS / "paper-microllama-c4.yaml")
    a, b = c.algorithm, c.batch
    assert (a.rounds, a.inner_steps, a.workers, a.trainers) == (20, 200, 4, 4)
    assert (c.inner.lr, c.outer.optimizer, c.outer.lr) == (2e-5, "sgd", 0.5)
    assert (b.initial, b.eta, b.vartheta, b.nu, b.test) == (1, 0.8, 0.01, 0.3, "augmented_inner_product")
    assert (c.merge.every, c.switch.mode, c.runtime.workers_per_process) == (3, "threshold", 4)
    assert (c.data.source, c.data.hub_config, c.data.streaming) == ("allenai/c4", "en", True)
    assert (c.model.name, c.model.reinit_output, c.model.precision) == ("keeeeenw/MicroLlama", True, "fp16")


def test_paper_config_stops_at_once_without_a_gpu_or_the_hub() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "adloco", "train", "-c", str(CONFIGS / "paper-microllama-c4.yaml")],
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=120,
    )
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert "no CUDA device is available" in line or "offline" in line


@pytest.mark.parametrize("name", ["diloco.yaml", "localsgd.yaml"])
def test_baseline_configs_run(name: str) -> None:
    c = resolve(
        CONFIGS / name,
        [
            "model.name=llama-micro",
            "data.seq_len=8",
            "algorithm.rounds=1",
            "algorithm.inner_steps=2",
            "batch.initial=2",
            "switch.b_max=2",
            "eval.max_examples=4",
            "logging.progress=off",
        ],
    )
    out = coordinator(c).run_round()
    assert len([e for e in out["events"] if e["event"] == "worker"]) == 4
    assert not [e for e in out["events"] if e["event"] == "merge"]
