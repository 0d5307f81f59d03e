"""The trackers beside metrics.jsonl, read back: TensorBoard, Weights & Biases (offline: nothing leaves this
machine) and MLflow (a file store in the run directory) get the same scalars, by round, and W&B and MLflow
the run's config; W&B and MLflow only when ``logging.trackers`` lists them, installed or not; a tracker
listed (or TensorBoard ``on``) with its package missing is refused in one line naming the extra."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from adloco.cli import main
from adloco.telemetry import metrics
from tests.helpers import TINY_QUIET, S


def wandb_records(run_dir: Path) -> list[Any]:
    """The records of an offline W&B run (``run-<id>.wandb``: W&B's transaction log, LevelDB's log format
    after a 7-byte header: 32 KiB blocks of records, each a checksum, a length, a type and a piece of a
    protobuf ``Record``). wandb has no reader of its own for it any more."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pos, piece, block = [], 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and n == 0:
            break
        piece += data[pos : pos + n]
        pos += n
        if kind in (1, 4):  # a whole record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(piece)
            out.append(rec)
            piece = b""
    return out


def logged_to_wandb(run_dir: Path) -> tuple[dict[tuple[str, int], float], dict[str, Any]]:
    scalars: dict[tuple[str, int], float] = {}
    config: dict[str, Any] = {}
    for rec in wandb_records(run_dir):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            step = int(row.pop("_step"))
            scalars.update({(k, step): v for k, v in row.items() if not k.startswith("_")})
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
    return scalars, config


def logged_to_mlflow(run_dir: Path) -> tuple[dict[tuple[str, int], float], dict[str, str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    run = client.get_run((run_dir / "mlflow-run-id").read_text().strip())
    scalars = {
        (name, m.step): m.value
        for name in run.data.metrics
        for m in client.get_metric_history(run.info.run_id, name)
    }
    return scalars, run.data.params


def expected(run_dir: Path) -> dict[tuple[str, int], float]:
    out: dict[tuple[str, int], float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        out.update({(n, r): float(v) for n, v, r in metrics.scalars(json.loads(line))})
    return out


@pytest.fixture
def trackers_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # tests/conftest.py sets it too: nothing is sent
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)


@pytest.mark.long
def test_wandb_and_mlflow_get_the_scalars_and_the_config(
    tmp_path: Path, text_corpus: Path, trackers_here: None
) -> None:
    pytest.importorskip("wandb", reason="the wandb extra (installed with dev; CI has it)")
    pytest.importorskip("mlflow", reason="the mlflow extra (installed with dev; CI has it)")
    sets = S(
        f"data.source={text_corpus}",
        f"logging.out_dir={tmp_path}",
        "logging.trackers=wandb,mlflow",
        *TINY_QUIET,
    )
    assert main(["train", *sets]) == 0
    (run,) = list(tmp_path.iterdir())
    want = expected(run)
    assert ("train/loss", 2) in want and ("val/val_ppl", 0) in want and ("run/bytes_total", 1) in want
    w_scalars, w_config = logged_to_wandb(run)
    assert w_scalars == pytest.approx(want)
    assert w_config["algorithm"]["rounds"] == 2 and w_config["model"]["name"] == "llama-micro"
    m_scalars, m_params = logged_to_mlflow(run)
    assert m_scalars == pytest.approx(want)
    assert m_params["algorithm.rounds"] == "2" and m_params["model.name"] == "llama-micro"
    # TensorBoard: the same names
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {n for n, _ in want}


def test_trackers_only_when_listed_and_older_configs_keep_theirs(
    tmp_path: Path, text_corpus: Path, trackers_here: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed is not asked: by default only TensorBoard's local files (auto) beside the run's own. An older
    config's logging.wandb / logging.mlflow keep what they did: on, or auto with the package installed."""
    pytest.importorskip("wandb", reason="the wandb extra (installed with dev; CI has it)")
    pytest.importorskip("mlflow", reason="the mlflow extra (installed with dev; CI has it)")
    sets = S(f"data.source={text_corpus}", f"logging.out_dir={tmp_path}", *TINY_QUIET)
    assert main(["train", *sets]) == 0
    (run,) = list(tmp_path.iterdir())
    assert not (run / "mlruns").exists() and not (run / "wandb").exists()
    assert "trackers: []" in (run / "config.yaml").read_text()
    monkeypatch.setattr(metrics, "available", lambda sink: sink == "mlflow")  # as if wandb were not installed
    old = S("logging.name=older", "logging.wandb=auto", "logging.mlflow=auto", "logging.tensorboard=off")
    assert main(["train", *sets, *old]) == 0
    (older,) = [p for p in tmp_path.iterdir() if p.name.startswith("older-")]
    assert (
        (older / "mlruns").is_dir()
        and not (older / "wandb").exists()
        and not (older / "tensorboard").exists()
    )
    assert "trackers:\n  - mlflow" in (older / "config.yaml").read_text()


@pytest.mark.parametrize("sink", ["wandb", "mlflow", "tensorboard"])
def test_a_tracker_asked_for_without_its_package_is_refused_in_one_line(
    sink: str,
    tmp_path: Path,
    text_corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(metrics, "available", lambda s: s != sink)
    ask = "logging.tensorboard=on" if sink == "tensorboard" else f"logging.trackers=[{sink}]"
    sets = S(f"data.source={text_corpus}", f"logging.out_dir={tmp_path / 'runs'}", ask, *TINY_QUIET)
    assert main(["train", *sets]) == 2
    err = capsys.readouterr().err.strip()
    if sink == "tensorboard":
        assert err == (
            "adloco: error: config: logging.tensorboard = 'on': the tensorboard package is not installed "
            "(pip install 'adloco[tensorboard]', or 'auto' to log there only when installed)"
        )
    else:
        assert err == (
            f"adloco: error: config: logging.trackers = ['{sink}']: the {sink} package is not installed "
            f"(pip install 'adloco[{sink}]', or leave {sink} out)"
        )
    assert not (tmp_path / "runs").exists()
