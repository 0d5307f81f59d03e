"""``adloco train``: parse -> build -> train -> write the run directory. Nothing here is algorithmic.

The same function runs in-process and in every torch.distributed process; rank 0 alone prints progress
and writes the run directory, from numbers gathered from every rank.
"""

from __future__ import annotations

import json
import os
import signal
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


class Stopped(Exception):
    """SIGINT or SIGTERM: the run stopped at the end of an inner step and wrote a checkpoint."""

    def __init__(self, signum: int, round_: int, run_dir: Path | None, saved: str) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} in round {round_}")
        self.signum, self.round, self.run_dir, self.saved = signum, round_, run_dir, saved


class TrainingFailed(Exception):
    """Numerical faults persisted; a checkpoint of the last (finite) state was written."""

    def __init__(self, message: str, run_dir: Path | None, saved: str) -> None:
        super().__init__(message)
        self.run_dir, self.saved = run_dir, saved


# What a resumed run may change: how long it runs, learning rates, evaluation, checkpoints, logging and
# the runtime. Everything else (model, data, method, workers, seed ...) is the checkpoint's.
RESUMABLE = (
    "algorithm.rounds",
    "algorithm.budget",
    "inner.lr",
    "inner.clip",
    "outer.lr",
    "eval.",
    "checkpoint.",
    "faults.",
    "network.",
    "logging.",
    "runtime.",
    "data.cache_dir",
)


def check_resumable(cfg: Config, ck: Any) -> None:
    """Refuse a checkpoint written under another model, data or method (one line naming the field)."""
    saved = ck.meta.get("config")
    if not isinstance(saved, dict):
        raise UserError(f"checkpoint {str(ck.path)!r}: holds no config (not written by this adloco)")
    now = cfg.to_dict()
    for section, values in now.items():
        for key, value in values.items():
            path = f"{section}.{key}"
            old = (saved.get(section) or {}).get(key, value)
            if old != value and not any(
                path == r or (r.endswith(".") and path.startswith(r)) for r in RESUMABLE
            ):
                raise UserError(
                    f"--resume: {path} = {value!r} differs from the checkpoint's {old!r}: a resumed run keeps its "
                    "model, data and method (only rounds, learning rates, clipping, eval, checkpoint, faults, "
                    "logging and runtime settings may change)"
                )
    if cfg.algorithm.rounds < ck.round:
        raise UserError(
            f"config: algorithm.rounds = {cfg.algorithm.rounds}: the checkpoint is at round {ck.round} already"
        )


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


def _write_checkpoint(co: Coordinator, cfg: Config, run_dir: Path | None, sink: MetricsSink) -> str:
    """Every rank takes part; rank 0 writes. Returns the checkpoint's name."""
    from adloco import checkpoint
    from adloco.engine.coordinator import save_state

    t0 = time.perf_counter()
    writer = checkpoint.Writer(run_dir, co.round) if run_dir is not None else None
    try:
        meta = save_state(co, writer.tensors if writer is not None else None)
        if writer is not None:
            meta["config"] = cfg.to_dict()
            path = writer.finish(meta, cfg.checkpoint.keep)
            sink.log(
                {
                    "event": "checkpoint",
                    "round": co.round,
                    "name": path.name,
                    "bytes": sum(f.stat().st_size for f in path.iterdir()),
                    "seconds": time.perf_counter() - t0,
                }
            )
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return checkpoint.name(co.round)


class _Signals:
    """SIGINT and SIGTERM set a flag the workers read before every inner step; the first one counts, later
    ones are ignored so the checkpoint is written whole (SIGKILL still ends everything)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def train(cfg: Config, resume: tuple[Path, Path] | None = None) -> tuple[Path | None, dict[str, Any]]:
    """Train as configured; returns the run directory (None on ranks other than 0) and the summary.

    ``resume``: (run directory, checkpoint folder) to continue from (see :func:`adloco.checkpoint.locate`).
    """
    from adloco import checkpoint

    ck = None
    if resume is not None:
        ck = checkpoint.Checkpoint(resume[1])
        check_resumable(cfg, ck)
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
        if ck is not None:
            from adloco.engine.coordinator import restore_state

            restore_state(coordinator, ck)
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
            if resume is not None and ck is not None:
                from adloco.telemetry.metrics import truncate_after

                run_dir = resume[0]
                write_atomic(run_dir / "config.yaml", dump_yaml(cfg))
                truncate_after(run_dir / "metrics.jsonl", ck.round)
                say(f"resuming {run_dir} from {ck.path.name} (round {ck.round} of {cfg.algorithm.rounds})")
            else:
                run_dir = create_run_dir(cfg)
                write_atomic(run_dir / "config.yaml", dump_yaml(cfg))
                say(f"run directory {run_dir}")
            sink = JsonlSink(run_dir / "metrics.jsonl")
            if ck is not None:
                sink.log({"event": "resume", "round": ck.round, "checkpoint": ck.path.name})
        every = cfg.checkpoint.every

        def after_round(final: bool) -> None:
            if final or (every > 0 and coordinator is not None and coordinator.round % every == 0):
                assert coordinator is not None
                _write_checkpoint(coordinator, cfg, run_dir, sink)

        from adloco.engine.coordinator import RoundStopped, TooManyBadRounds

        try:
            with _Signals() as signals:
                coordinator.stop_requested = lambda: signals.signum is not None
                try:
                    summary = coordinator.run(sink, progress, after_round)
                except RoundStopped as exc:
                    progress.close()
                    assert signals.signum is not None or comm.world > 1
                    saved = _write_checkpoint(coordinator, cfg, run_dir, sink)
                    raise Stopped(signals.signum or signal.SIGTERM, exc.round, run_dir, saved) from None
                except TooManyBadRounds as exc:
                    raise TrainingFailed(str(exc), run_dir, checkpoint.name(coordinator.round)) from None
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
