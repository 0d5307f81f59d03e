"""``adloco train``: parse -> build -> train -> write the run directory. Nothing here is algorithmic.

The same function runs in-process and in every torch.distributed process; rank 0 alone prints progress
and writes the run directory, from numbers gathered from every rank.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from adloco import models
from adloco.config import Config, dump_yaml
from adloco.data.tokens import Data, prepare
from adloco.engine.backends.inprocess import InProcessComm
from adloco.engine.comm import Comm, CommFailure
from adloco.engine.coordinator import Coordinator
from adloco.errors import UserError
from adloco.telemetry.metrics import JsonlSink, MetricsSink
from adloco.telemetry.progress import Progress, make_progress


class DistributedFailure(Exception):
    """A rank died, hung or disagreed: the message is one line naming the rank and the round."""


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("config: runtime.device = 'cuda': no CUDA device is available (use 'auto' or 'cpu')")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def backend_of(cfg: Config) -> str:
    from adloco.engine.backends.torchdist import launched_by_torchrun

    if cfg.runtime.backend == "auto":
        return "torchdist" if launched_by_torchrun() else "inprocess"
    return cfg.runtime.backend


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


def _check_same_data(comm: Comm, data: Data) -> None:
    """Every process must train on the same tokens (machines may differ in their corpus or cache)."""
    from adloco.engine.backends.torchdist import fingerprint_tokens

    fp = float(fingerprint_tokens(*data.arrays()))
    got = comm.all_gather_rows({w: [fp] for w in comm.local_workers}, 1, "check", counted=0)
    odd = sorted({comm.owner(w) for w, (v,) in got.items() if v != fp})
    if odd:
        raise UserError(
            f"data: rank {comm.rank}'s tokens differ from rank(s) {', '.join(map(str, odd))}'s: every machine "
            "needs the same corpus; share data.cache_dir between machines or copy it from rank 0's"
        )


def train(cfg: Config) -> tuple[Path | None, dict[str, Any]]:
    """Train as configured; returns the run directory (None on ranks other than 0) and the summary."""
    ctx = None
    if backend_of(cfg) == "torchdist":
        from adloco.engine.backends import torchdist

        rt = cfg.runtime
        ctx = torchdist.start(
            cfg.algorithm.workers, rt.workers_per_process, rt.device, rt.threads, rt.timeout
        )
        comm: Comm = ctx.comm
        device = ctx.device
    else:
        if cfg.runtime.threads:
            torch.set_num_threads(cfg.runtime.threads)
        device = resolve_device(cfg.runtime.device)
        comm = InProcessComm(cfg.algorithm.workers)
    root = comm.rank == 0
    progress: Progress = make_progress(cfg.logging.progress) if root else Progress()
    say = progress.message
    coordinator: Coordinator | None = None
    try:
        # Everything that can fail on bad input happens before the run directory exists; rank 0 goes
        # first (tokenizer training, caches) and the others follow, or stop if it failed.
        if cfg.model.precision != "fp32" and device.type != "cuda":
            raise UserError(
                f"config: model.precision = {cfg.model.precision!r}: mixed precision needs CUDA (this run is on "
                f"{device.type}); use fp32"
            )

        def load_data() -> Data:
            return prepare(cfg.data, cfg.model.task, cfg.model.trust_remote_code, log=say)

        if ctx is not None:
            from adloco.engine.backends.torchdist import root_first

            data = root_first(ctx, load_data, cfg.runtime.timeout)
            _check_same_data(comm, data)
        else:
            data = load_data()
        factory = models.ModelFactory(
            cfg.model,
            data.vocab_size,
            cfg.data.seq_len,
            data.eos_id,
            data.pad_id,
            data.num_labels,
            getattr(data, "label_names", None),
        )
        coordinator = Coordinator(cfg, comm, data, factory, device, log=say)
        procs = f", {comm.world} processes x {ctx.threads} thread(s)" if ctx is not None else ""
        unit = f"blocks of {cfg.data.seq_len} tokens" if data.task == "causal_lm" else "labelled examples"
        say(
            f"{cfg.algorithm.method}: {cfg.model.name}, {coordinator.n_params / 1e6:.2f}M parameters, "
            f"{cfg.algorithm.workers} workers, {cfg.algorithm.trainers} trainers{procs}, {data.n_train} train / "
            f"{data.n_val} validation {unit}, device {device.type}"
        )
        run_dir = None
        sink: MetricsSink = MetricsSink()
        if root:
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
            state = coordinator.trainer_state_dict(summary["best_trainer"])
            if run_dir is not None and state is not None:
                model = next(iter(coordinator.workers.values())).model
                models.save(model, state, data.tokenizer, run_dir / "model")
        if run_dir is not None:
            write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
            if cfg.logging.plots:
                from adloco.report import plot_run

                plot_run(run_dir)
    except CommFailure as exc:
        if ctx is None:
            raise
        from adloco.engine.backends.torchdist import failure_line

        r = coordinator.round + 1 if coordinator is not None else 0
        raise DistributedFailure(failure_line(ctx, exc, r)) from exc
    except Exception as exc:
        from adloco.engine.coordinator import DecisionMismatch

        if isinstance(exc, DecisionMismatch):
            raise DistributedFailure(f"rank {comm.rank}: {exc}") from exc
        raise
    if ctx is not None:
        ctx.close()
    return run_dir, summary
