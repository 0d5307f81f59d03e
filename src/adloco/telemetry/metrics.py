"""Metrics sinks: a do-nothing base, JSONL (one event a line, always), TensorBoard (``logging.tensorboard``:
local files, when its package is installed unless set otherwise), and the experiment trackers Weights &
Biases and MLflow, only when ``logging.trackers`` lists them.

Sinks receive each event as the dict of its JSON line (:mod:`adloco.events` defines them); the three
trackers get the same scalars (:func:`scalars`), W&B and MLflow also the run's config.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any


class MetricsSink:
    """Receives one event (a flat-ish dict with an ``event`` key) at a time."""

    def log(self, event: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlSink(MetricsSink):
    """``metrics.jsonl``: one event a line, flushed as it is written."""

    def __init__(self, path: Path) -> None:
        import threading

        self.path = path
        self._f = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()  # the checkpoint thread logs too

    def log(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()

    def close(self) -> None:
        self._f.close()


def scalars(event: dict[str, Any]) -> list[tuple[str, float, int]]:
    """(name, value, round) of every scalar an event carries: every round's loss, validation metrics
    (best and per trainer), requests, trainers alive, examples, bytes and simulated time."""
    kind, r = event.get("event"), int(event.get("round", 0))
    out: list[tuple[str, float, int]] = []
    val = ("val_ppl", "val_loss", "val_accuracy")

    def num(k: str) -> bool:
        return isinstance(event.get(k), (int, float)) and not isinstance(event.get(k), bool)

    if kind == "start":
        out += [(f"val/{k}", event[k], 0) for k in val if num(k)]
    elif kind == "round":
        out += [(f"{'train' if k == 'loss' else 'val'}/{k}", event[k], r) for k in ("loss", *val) if num(k)]
        for k in ("trainers_alive", "examples_total", "bytes_total", "communications_total", "sim_total_s"):
            if num(k):
                out.append((f"run/{k}", event[k], r))
        out += [(f"request/trainer_{t}", b, r) for t, b in event["requests"].items()]
    elif kind == "eval":
        out += [(f"val_by_trainer/{k}/trainer_{event['trainer']}", event[k], r) for k in val if num(k)]
    return out


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """``{"section.key": value}`` of a config tree (MLflow's parameters are flat)."""
    return {
        f"{s}.{k}": v for s, keys in config.items() if isinstance(keys, dict) for k, v in keys.items()
    } | {s: v for s, v in config.items() if not isinstance(v, dict)}


class TensorBoardSink(MetricsSink):
    """Scalars for TensorBoard under ``<run>/tensorboard`` (:func:`scalars`), by round."""

    def __init__(self, path: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(path))

    def log(self, event: dict[str, Any]) -> None:
        for name, value, r in scalars(event):
            self.writer.add_scalar(name, value, r)

    def close(self) -> None:
        self.writer.close()


class WandbSink(MetricsSink):
    """A Weights & Biases run: the scalars (:func:`scalars`) with the round as W&B's step, and the run's
    config. Offline (files under ``<run>/wandb``, uploaded later with ``wandb sync``) unless ``WANDB_MODE``
    says otherwise; project ``WANDB_PROJECT`` (default ``adloco``), named after the run directory. The run's
    id is kept in ``<run>/wandb/adloco-run-id``, so a resumed run continues the same W&B run (W&B keeps the
    first values of the rounds a resume repeats)."""

    def __init__(self, run_dir: Path, config: dict[str, Any] | None) -> None:
        import wandb

        folder = run_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / "adloco-run-id"
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "adloco"),
            name=run_dir.name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
            config=config,
            settings=wandb.Settings(quiet=True),
        )
        self._step = -1

    def log(self, event: dict[str, Any]) -> None:
        rows: dict[int, dict[str, float]] = {}
        for name, value, r in scalars(event):
            rows.setdefault(r, {})[name] = value
        for r, row in sorted(rows.items()):
            if r >= self._step:  # W&B refuses a step that goes back (a resume repeats rounds)
                self.run.log(row, step=r)
                self._step = r

    def close(self) -> None:
        self.run.finish()


class MlflowSink(MetricsSink):
    """An MLflow run: the scalars (:func:`scalars`) as metrics by round and the run's config as parameters
    (``section.key``). Tracked where ``MLFLOW_TRACKING_URI`` points, else in a local file store in
    ``<run>/mlruns`` (viewed with the full ``mlflow`` package: ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui
    --backend-store-uri <run>/mlruns``); experiment
    ``MLFLOW_EXPERIMENT_NAME`` (default ``adloco``), run named after the run directory. The run's id is kept
    in ``<run>/mlflow-run-id``, so a resumed run continues the same MLflow run."""

    def __init__(self, run_dir: Path, config: dict[str, Any] | None) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # MLflow calls its file store "maintenance mode" and wants this to use it; the file store is
            # the one that needs no server and no database package (mlflow-skinny has none)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (run_dir / "mlruns").resolve().as_uri()
        self.client = client = MlflowClient(tracking_uri=uri)
        id_file = run_dir / "mlflow-run-id"
        if id_file.is_file():
            self.run_id = id_file.read_text().strip()
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "adloco")
            exp = client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
            self.run_id = client.create_run(exp_id, run_name=run_dir.name).info.run_id
            id_file.write_text(self.run_id + "\n")
            if config:  # parameters cannot change once logged: only a new run logs them
                from mlflow.entities import Param

                params = [Param(k, str(v)) for k, v in flat_config(config).items()]
                for i in range(0, len(params), 100):  # MLflow takes at most 100 a batch
                    client.log_batch(self.run_id, params=params[i : i + 100])
        self._mlflow = mlflow

    def log(self, event: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        got = scalars(event)
        if got:
            now = int(time.time() * 1000)
            metrics = [Metric(name, float(value), now, r) for name, value, r in got]
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Sinks(MetricsSink):
    """Several sinks as one."""

    def __init__(self, *sinks: MetricsSink) -> None:
        self.sinks = sinks

    def log(self, event: dict[str, Any]) -> None:
        for s in self.sinks:
            s.log(event)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


# a sink -> (the package that must be importable, the extra that installs it)
PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}
TRACKERS: tuple[str, ...] = ("wandb", "mlflow")  # what logging.trackers may list


def available(sink: str) -> bool:
    """Whether ``sink``'s package is installed (without importing it)."""
    return importlib.util.find_spec(PACKAGES[sink][0]) is not None


def tensorboard_available() -> bool:
    return available("tensorboard")


def wanted(sink: str, mode: str) -> bool:
    """``on``, or ``auto`` with the package installed."""
    return mode == "on" or (mode == "auto" and available(sink))


def check_sinks(logging: Any) -> None:
    """Refuse TensorBoard set ``on``, or a tracker listed in ``logging.trackers``, whose package is missing,
    in one line naming the extra to install (before the run directory exists)."""
    from adloco.errors import UserError

    if logging.tensorboard == "on" and not available("tensorboard"):
        raise UserError(
            "config: logging.tensorboard = 'on': the tensorboard package is not installed "
            "(pip install 'adloco[tensorboard]', or 'auto' to log there only when installed)"
        )
    for sink in logging.trackers:
        if not available(sink):
            package, extra = PACKAGES[sink]
            raise UserError(
                f"config: logging.trackers = {list(logging.trackers)!r}: the {package} package is not installed "
                f"(pip install 'adloco[{extra}]', or leave {sink} out)"
            )


def make_sink(run_dir: Path, logging: Any = "auto", config: dict[str, Any] | None = None) -> MetricsSink:
    """JSONL always; TensorBoard with ``on``, or with ``auto`` when its package is installed; W&B and MLflow
    when ``logging.trackers`` lists them. ``logging``: the ``logging`` section (or, as before, TensorBoard's
    mode alone); ``config``: the run's config tree, for W&B and MLflow."""
    tensorboard, trackers = (
        (logging, []) if isinstance(logging, str) else (logging.tensorboard, logging.trackers)
    )
    sinks: list[MetricsSink] = [JsonlSink(run_dir / "metrics.jsonl")]
    if wanted("tensorboard", tensorboard):
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    if "wandb" in trackers:
        sinks.append(WandbSink(run_dir, config))
    if "mlflow" in trackers:
        sinks.append(MlflowSink(run_dir, config))
    return sinks[0] if len(sinks) == 1 else Sinks(*sinks)


def truncate_after(path: Path, round_: int) -> int:
    """Drop the events of rounds after ``round_`` (and a torn last line), atomically: a resumed run
    continues the file with no round missing or repeated. Returns how many lines were dropped."""
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if int(event.get("round", 0)) <= round_ and event.get("event") != "end":
            kept.append(line)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write("".join(x + "\n" for x in kept))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return len(lines) - len(kept)
