"""``adloco train``: parse -> build -> train -> write the run directory. Nothing here is algorithmic."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from adloco import models
from adloco.config import Config, dump_yaml
from adloco.data.tokens import prepare
from adloco.engine.backends.inprocess import InProcessComm
from adloco.engine.coordinator import Coordinator
from adloco.errors import UserError
from adloco.telemetry.metrics import JsonlSink
from adloco.telemetry.progress import Progress, make_progress


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("config: runtime.device = 'cuda': no CUDA device is available (use 'auto' or 'cpu')")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def create_run_dir(cfg: Config) -> Path:
    """``<out_dir>/<name>-<timestamp>`` (with a suffix if taken). Created only once input is valid."""
    parent = Path(cfg.logging.out_dir).expanduser()
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"config: logging.out_dir = {cfg.logging.out_dir!r}: cannot be created ({exc.strerror})"
        ) from None
    if not os.access(parent, os.W_OK):
        raise UserError(f"config: logging.out_dir = {cfg.logging.out_dir!r}: not writable")
    base = f"{cfg.logging.name or cfg.algorithm.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    for i in range(1000):
        path = parent / (base if i == 0 else f"{base}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise UserError(f"config: logging.out_dir = {cfg.logging.out_dir!r}: too many runs named {base!r}")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def train(cfg: Config) -> tuple[Path, dict[str, Any]]:
    """Train as configured; returns the run directory and the summary."""
    if cfg.runtime.threads:
        torch.set_num_threads(cfg.runtime.threads)
    device = resolve_device(cfg.runtime.device)
    progress: Progress = make_progress(cfg.logging.progress)
    say = progress.message

    # Everything that can fail on bad input happens before the run directory exists.
    data = prepare(cfg.data, log=say)

    def build(seed: int) -> torch.nn.Module:
        return models.build(cfg.model.name, data.vocab_size, cfg.data.seq_len, data.eos_id, seed)

    comm = InProcessComm(cfg.algorithm.workers)
    coordinator = Coordinator(cfg, comm, data, build, device, log=say)
    say(
        f"{cfg.algorithm.method}: {models.count_parameters(next(iter(coordinator.workers.values())).model) / 1e6:.2f}M "
        f"parameters, {cfg.algorithm.workers} workers, {cfg.algorithm.trainers} trainers, "
        f"{data.n_train_blocks} train / {data.n_val_blocks} validation blocks of {cfg.data.seq_len} tokens, "
        f"device {device.type}"
    )
    run_dir = create_run_dir(cfg)
    write_atomic(run_dir / "config.yaml", dump_yaml(cfg))
    say(f"run directory {run_dir}")
    sink = JsonlSink(run_dir / "metrics.jsonl")
    try:
        summary = coordinator.run(sink, progress)
        sink.log({"event": "end", **summary})
    finally:
        sink.close()
        progress.close()
    if cfg.logging.save_model:
        best = summary["best_trainer"]
        leader = coordinator.members()[best][0]
        models.save(
            coordinator.workers[leader].model,
            coordinator.trainer_state_dict(best),
            data.tokenizer,
            run_dir / "model",
        )
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    if cfg.logging.plots:
        from adloco.report import plot_run

        plot_run(run_dir)
    return run_dir, summary
