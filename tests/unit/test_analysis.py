"""``adloco analyze-gradients``: a real checkpoint end to end, and every statistic against brute force."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from adloco.engine.evaluation import evaluate, spread
from adloco.errors import UserError
from adloco.library.algorithms import batching
from adloco.library.flat import FlatModule
from adloco.library.settings import AdaptiveBatch as BatchConfig
from adloco.report import analysis
from tests.helpers import build_fn, synthetic_data, tiny_config, train_once

TRAIN = {
    "model.name": "llama-micro",
    "data.tokenizer": "bpe:300",
    "data.seq_len": "16",
    "algorithm.rounds": "1",
    "algorithm.inner_steps": "2",
    "eval.max_examples": "4",
    "logging.progress": "off",
    "logging.plots": "false",
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, text_corpus: Path) -> Path:
    return train_once(tmp_path_factory.mktemp("runs"), {**TRAIN, "data.source": str(text_corpus)})


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="adloco")
    analysis.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["analyze-gradients", *argv])


def run(*argv: str) -> str:
    """Run the command in this process; returns its stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert analysis.run(parse(*argv)) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def analyzed(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    out = tmp_path_factory.mktemp("analysis")
    stdout = run(
        *("--checkpoint", str(run_dir), "--examples", "128", "--batch-sizes", "1,2,4,8"),
        *("--repeats", "64", "--seed", "3", "--out", str(out)),
    )
    return out, json.loads((out / "gradients.json").read_text()), stdout


@pytest.mark.long
def test_writes_every_output_and_prints_the_table(analyzed: tuple[Path, dict[str, Any], str]) -> None:
    out, doc, stdout = analyzed
    for name in ("gradients.json", "report.md", "deviations.png", "variance_vs_batch.png"):
        assert (out / name).stat().st_size > 0, name
    assert doc["round"] == 1 and doc["trainer"] == 0 and doc["examples"] == 128
    assert [s["b"] for s in doc["summary"]] == [1, 2, 4, 8]
    assert all(len(s["deviations"]) == 64 and len(s["paper"]) == 16 for s in doc["sizes"])
    assert "mean ‖g_B−G‖²" in stdout and f"outputs: {out}" in stdout
    assert "| b |" in (out / "report.md").read_text()


@pytest.mark.long
def test_minibatch_deviations_follow_the_finite_population_theory(
    analyzed: tuple[Path, dict[str, Any], str],
) -> None:
    _, doc, _ = analyzed
    n, sigma2 = doc["examples"], doc["sigma2"]
    assert sigma2 > 0 and doc["grad_sq"] > 0
    assert doc["mean_gap"] < 1e-4  # one backward per example averages to the micro-batched G
    for row in doc["summary"]:
        b = row["b"]
        assert row["theory"] == pytest.approx(sigma2 / b * (n - b) / n)
        assert 0.5 < row["mean_deviation"] / row["theory"] < 2.0, row
    # at a common θ both estimators are unbiased for σ² (averaged over every group and size)
    for name in ("pooled", "paper"):
        est = np.mean([e["sigma2"] for s in doc["sizes"] for e in s[name]])
        assert 0.67 < est / sigma2 < 1.5, name


@pytest.mark.long
def test_checkpoint_folder_other_trainer_and_default_output(run_dir: Path) -> None:
    folder = run_dir / "checkpoints" / "round-000001"
    stdout = run(
        *("--checkpoint", str(folder), "--trainer", "2", "--examples", "40"),
        *("--batch-sizes", "1,3", "--repeats", "4"),
    )
    out = run_dir / "analysis" / "gradients-round-000001-trainer-2"
    assert f"outputs: {out}" in stdout and "trainer 2" in stdout
    doc = json.loads((out / "gradients.json").read_text())
    assert doc["trainer"] == 2 and doc["sizes"][1]["layout"] == [3, 1, False]


@pytest.mark.long
def test_loads_the_trainers_theta(run_dir: Path) -> None:
    """The rebuilt model at θ scores the validation loss the run recorded for that trainer."""
    _, ck = analysis.open_checkpoint(run_dir)
    cfg, data, flat = analysis.load_model(ck, 1, torch.device("cpu"), lambda s: None)
    idx = spread(data.n_val, cfg.eval.max_examples)
    res = evaluate(flat.module, data.val_batch, idx, cfg.eval.batch_size)
    assert res.loss == pytest.approx(ck.meta["driver"]["last_eval"]["1"], rel=1e-5)


@pytest.mark.long
@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (("--trainer", "9"), "--trainer 9"),
        (("--batch-sizes", "0,2"), "--batch-sizes"),
        (("--batch-sizes", "two"), "--batch-sizes"),
        (("--repeats", "6"), "--repeats 6"),
        (("--workers", "1"), "--workers 1"),
        (("--examples", "10", "--batch-sizes", "4"), "--batch-sizes 4"),
        (("--examples", "100000"), "--examples 100000"),
    ],
)
def test_bad_options_are_one_line(run_dir: Path, argv: tuple[str, ...], names: str) -> None:
    with pytest.raises(UserError) as exc:
        analysis.run(parse("--checkpoint", str(run_dir), *argv))
    assert names in str(exc.value) and "\n" not in str(exc.value)


def test_bad_checkpoint_path_is_one_line(tmp_path: Path) -> None:
    for path in (tmp_path / "missing", tmp_path):
        with pytest.raises(UserError) as exc:
            analysis.run(parse("--checkpoint", str(path)))
        msg = str(exc.value)
        assert msg.startswith(f"--checkpoint {str(path)!r}:") and "\n" not in msg


def test_every_statistic_matches_stacked_per_example_gradients() -> None:
    """σ², ‖G‖², each deviation and both estimators, from explicit (N, P) per-example gradients."""
    cfg = tiny_config()
    data = synthetic_data(seq_len=cfg.data.seq_len, n_train_blocks=40)
    model = build_fn(data, cfg).build(5)
    model.eval()
    indices = np.arange(1, 40, 3)  # N = 13
    n, M = len(indices), 2
    batch = BatchConfig(probe_chunks=2)
    grads = analysis.Gradients(FlatModule(model), data.train_batch, micro=3)
    res = analysis.analyze(grads, indices, [1, 3], 4, M, batch, np.random.default_rng(7), lambda s: None)

    params = list(model.parameters())
    S = torch.stack(
        [
            torch.cat(
                [
                    g.reshape(-1)
                    for g in torch.autograd.grad(model(**data.train_batch(indices[i : i + 1])).loss, params)
                ]
            ).double()
            for i in range(n)
        ]
    )  # (N, P)
    G = S.mean(0)

    def sq(x: torch.Tensor) -> float:
        return float((x * x).sum())

    assert res.sigma2 == pytest.approx(sum(sq(g - G) for g in S) / (n - 1), rel=1e-5)
    assert res.grad_sq == pytest.approx(sq(G), rel=1e-5)
    assert res.per_example == pytest.approx([sq(g - G) for g in S], rel=1e-4)

    rng = np.random.default_rng(7)  # the same draws, in the same order
    for size in res.sizes:
        b = size.b
        k, c, extra = batching.probe_layout([b] * M, 2)
        assert size.layout == (k, c, extra)
        for group in range(2):
            perm = rng.permutation(n)
            gB = torch.stack([S[perm[m * b : (m + 1) * b]].mean(0) for m in range(M)])  # (M, P)
            assert size.deviations[group * M : (group + 1) * M] == pytest.approx(
                [sq(g - G) for g in gB], rel=1e-4
            )
            paper = b * (sum(sq(g) for g in gB) - M * sq(gB.mean(0))) / (M - 1)
            assert size.paper[group].sigma2 == pytest.approx(paper, rel=1e-4)
            probe = [
                perm[M * b + m * k : M * b + (m + 1) * k] if extra else perm[m * b : m * b + k * c]
                for m in range(M)
            ]
            chunks = torch.stack([S[p].reshape(k, c, -1).mean(1) for p in probe])  # (M, k, P)
            within = sum(sq(chunks[m] - chunks[m].mean(0)) for m in range(M))
            assert size.pooled[group].sigma2 == pytest.approx(c * within / (M * k - M), rel=1e-4)


def test_the_estimators_target_follows_noise_rows_as_training_does() -> None:
    """``batch.noise_rows: requested``: the analysis reads T as the batch test would for a request of b
    rows a worker probed on fewer (8 chunks of 1 out of 10), not the probed rows' bound."""
    st = batching.TrainerStats(
        32, 1, 4, sigma2=8.0, gbar_sq=8.0 / 32, var_p=np.nan, orth_sq=np.nan, exact=False
    )
    probed = analysis.Estimate.of(st, BatchConfig(eta=0.9, noise_rows="probed"), 10)
    requested = analysis.Estimate.of(st, BatchConfig(eta=0.9, noise_rows="requested"), 10)
    assert probed.target == pytest.approx(8 / 0.81) and requested.target == pytest.approx(10 / 0.81)
    assert analysis.Estimate.of(st, BatchConfig(eta=0.9), 10) == requested  # the default (null)
