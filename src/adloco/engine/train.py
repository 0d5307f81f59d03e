"""``adloco train``: parse -> build -> train -> write the run directory. Nothing here is algorithmic.

The same function runs in-process and in every torch.distributed process; rank 0 alone prints progress
and writes the run directory, from numbers gathered from every rank.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from adloco import events, models
from adloco.comm.base import Comm, CommFailure
from adloco.comm.inprocess import InProcessComm
from adloco.config import Config, dump_yaml
from adloco.data.tokens import Data, prepare
from adloco.engine import rundir
from adloco.engine.checkpoint.saver import Checkpointer
from adloco.engine.checkpoint.state import RunState
from adloco.engine.driver import Driver, TooManyBadRounds
from adloco.errors import UserError
from adloco.method import DecisionMismatch, RoundAborted
from adloco.telemetry.metrics import MetricsSink, make_sink
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


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("config: runtime.device = 'cuda': no CUDA device is available (use 'auto' or 'cpu')")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def backend_of(cfg: Config) -> str:
    from adloco.engine.dist.env import launched_by_torchrun

    if cfg.runtime.backend == "auto":
        return "torchdist" if launched_by_torchrun() else "inprocess"
    return cfg.runtime.backend


def _check_same_data(comm: Comm, data: Data) -> None:
    """Every process must train on the same tokens (machines may differ in their corpus or cache)."""
    from adloco.engine.dist.join import fingerprint_tokens

    fp = float(fingerprint_tokens(*data.arrays()))
    got = comm.all_gather_rows({w: [fp] for w in comm.local_workers}, 1, "check", counted=0)
    odd = sorted({comm.owner(w) for w, (v,) in got.items() if v != fp})
    if odd:
        raise UserError(
            f"data: rank {comm.rank}'s tokens differ from rank(s) {', '.join(map(str, odd))}'s: every machine "
            "needs the same corpus; share data.cache_dir between machines or copy it from rank 0's"
        )


class _LogToProgress(logging.Handler):
    """The library's warnings (``logging.getLogger("adloco")``) as progress messages on rank 0."""

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        self.say(record.getMessage())


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

    ``resume``: (run directory, checkpoint folder) to continue from (see :func:`adloco.engine.checkpoint.locate`).
    Under torchrun's elastic agent (``--max-restarts`` ≥ 1) a run continues from its own newest
    checkpoint after a restart, with the number of workers the restart brought.
    """
    from adloco.engine import checkpoint
    from adloco.engine.dist import env, join

    elastic = env.elastic_launch()
    ctx = None
    if cfg.runtime.shards > 1 and backend_of(cfg) != "torchdist":
        raise UserError(
            f"config: runtime.shards = {cfg.runtime.shards}: a sharded worker is several processes: start with "
            "adloco train --nproc N (or torchrun), N = algorithm.workers x runtime.shards"
        )
    if backend_of(cfg) == "torchdist":
        rt = cfg.runtime
        ctx = join.start(
            cfg.algorithm.workers,
            rt.workers_per_process,
            rt.device,
            rt.threads,
            cfg.elastic.timeout if elastic is not None else rt.timeout,  # a dead peer costs a restart, soon
            rt.dist_backend,
            flexible=elastic is not None or resume is not None,
            shards=rt.shards,
        )
        cfg = cfg.replace(algorithm={"workers": ctx.comm.n_workers})
        comm: Comm = ctx.comm
        device = ctx.device
        # the rank whose disk holds the run (a restart may have given it any rank) writes it
        join.elect_root(ctx, rundir.newest_round(cfg, resume, elastic))
    else:
        if cfg.runtime.threads:
            torch.set_num_threads(cfg.runtime.threads)
        device = resolve_device(cfg.runtime.device)
        comm = InProcessComm(cfg.algorithm.workers)
    root = comm.rank == comm.root
    progress: Progress = make_progress(cfg.logging.progress) if root else Progress()
    say = progress.message
    library_log = logging.getLogger("adloco")
    handler = _LogToProgress(say)
    library_log.addHandler(handler)
    library_log.propagate = False
    driver: Driver | None = None
    start: rundir.Start | None = None
    try:
        # Everything that can fail on bad input happens before the run directory exists; rank 0 goes
        # first (where the run continues from, tokenizer training, caches) and the others follow, or
        # stop if it failed.
        from adloco.telemetry.metrics import check_sinks

        check_sinks(cfg.logging)  # a sink set on whose package is missing
        if cfg.runtime.cuda_graphs and device.type != "cuda":
            raise UserError(
                f"config: runtime.cuda_graphs = True: CUDA graphs need CUDA (this run is on {device.type}); "
                "leave it off"
            )
        if cfg.model.precision != "fp32" and device.type != "cuda":
            raise UserError(
                f"config: model.precision = {cfg.model.precision!r}: mixed precision needs CUDA (this run is on "
                f"{device.type}); use fp32"
            )

        def load_data() -> Data:
            return prepare(cfg.data, cfg.model.task, cfg.model.trust_remote_code, log=say)

        def prepare_root() -> Data:
            nonlocal start
            start = rundir.locate(cfg, resume, elastic)
            return load_data()

        if ctx is not None:
            data = join.root_first(ctx, prepare_root, cfg.runtime.timeout, others=load_data)
            _check_same_data(comm, data)
        else:
            data = prepare_root()
        ck = start.ck if start is not None else None
        driver = Driver(
            cfg, comm, data, models.factory_for(cfg.model, cfg.data.seq_len, data), device, log=say
        )
        if ck is not None and (
            ck.meta["driver"].get("model") != driver.fingerprint()
            or ck.meta["algorithm"].get("parameters") != driver.n_params
        ):
            raise UserError(
                f"checkpoint {str(ck.path)!r}: holds a model of {ck.meta['algorithm'].get('parameters', 0):,} "
                f"parameters with other shapes or names; this run builds {driver.n_params:,} "
                f"({cfg.model.name!r}): a run resumes with its own model"
            )
        # every process learns from rank 0 whether the run continues, and gets its state over the group
        continues = comm.all_gather_json(ck is not None)[comm.root]
        if not continues and cfg.algorithm.trainers > cfg.algorithm.workers:
            say(
                f"algorithm.trainers = {cfg.algorithm.trainers}: this launch has {cfg.algorithm.workers} workers; "
                f"starting with {cfg.algorithm.workers} trainers"
            )
        if continues:
            run_state = RunState(driver)
            run_state.load(run_state.share(checkpoint.load(ck) if ck is not None else None))
        procs = f", {comm.world} processes x {ctx.threads} thread(s)" if ctx is not None else ""
        unit = f"blocks of {cfg.data.seq_len} tokens" if data.task == "causal_lm" else "labelled examples"
        say(
            f"{cfg.algorithm.method}: {cfg.model.name}, {driver.n_params / 1e6:.2f}M parameters, "
            f"{cfg.algorithm.workers} workers, {cfg.algorithm.trainers} trainers{procs}, {data.n_train} train / "
            f"{data.n_val} validation {unit}, device {device.type}"
        )
        run_dir, sink = _open_run(cfg, start, driver, elastic, say) if root else (None, MetricsSink())
        if run_dir is not None and cfg.logging.trace:
            driver.trace_dir = run_dir / "trace"
        every = cfg.elastic.checkpoint_every if elastic is not None else cfg.checkpoint.every
        saver = Checkpointer(driver, cfg.to_dict, run_dir, sink, cfg.checkpoint.keep, background=True)

        def after_round(final: bool) -> None:
            assert driver is not None
            if final or (every > 0 and driver.round % every == 0):
                saver.save(wait=final)

        try:
            with _Signals() as signals:
                driver.stop_requested = lambda: signals.signum is not None
                try:
                    summary = driver.run(sink, progress, after_round)
                except RoundAborted as exc:
                    progress.close()
                    assert signals.signum is not None or comm.world > 1
                    saved = saver.save(wait=True)
                    raise Stopped(signals.signum or signal.SIGTERM, exc.round, run_dir, saved) from None
                except TooManyBadRounds as exc:
                    saver.wait()
                    raise TrainingFailed(str(exc), run_dir, checkpoint.name(driver.round)) from None
            saver.wait()
            sink.log(events.End(driver.round, summary).to_dict())
        finally:
            try:
                saver.wait()
            finally:
                sink.close()
                progress.close()
        if cfg.logging.save_model:
            state = driver.trainer_state_dict(summary.reported_trainer)
            if run_dir is not None and state is not None:
                model = next(iter(driver.algo.replicas.values())).model
                models.save(model, state, data.tokenizer, run_dir / "model")
        if run_dir is not None and driver.auto_profile and driver.profile is not None:
            driver.profile.save(
                run_dir / "profile.json"
            )  # the run's own fit: adloco report --profile takes it
        if run_dir is not None:
            rundir.write_atomic(run_dir / "summary.json", json.dumps(summary.to_dict(), indent=2) + "\n")
    except CommFailure as exc:
        if ctx is None:
            raise
        r = driver.round + 1 if driver is not None else 0
        raise DistributedFailure(join.failure_line(ctx, exc, r)) from exc
    except DecisionMismatch as exc:
        raise DistributedFailure(f"rank {comm.rank}: {exc}") from exc
    finally:
        library_log.removeHandler(handler)
    if ctx is not None:
        ctx.close()
    return run_dir, summary.to_dict()


def _open_run(
    cfg: Config,
    start: rundir.Start | None,
    driver: Driver,
    elastic: dict[str, Any] | None,
    say: Callable[[str], None],
) -> tuple[Path, MetricsSink]:
    """Rank 0: the run directory (new, or the one continued), its config.yaml and metrics sink, and the
    events that say how this process started (a resume, a membership change)."""
    from adloco.telemetry.metrics import truncate_after

    ck = start.ck if start is not None else None
    run_dir = start.run_dir if start is not None and start.run_dir is not None else rundir.create(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.write_atomic(run_dir / "config.yaml", dump_yaml(cfg))
    if ck is not None:
        truncate_after(run_dir / "metrics.jsonl", ck.round)
        say(f"resuming {run_dir} from {ck.path.name} (round {ck.round} of {cfg.algorithm.rounds})")
    elif start is not None and start.restarted:  # restarted before its first checkpoint: start over here
        truncate_after(run_dir / "metrics.jsonl", -1)
        say(f"run directory {run_dir} (restarted before its first checkpoint: from the start)")
    else:
        say(f"run directory {run_dir}")
    sink = make_sink(run_dir, cfg.logging, cfg.to_dict())
    if ck is not None:
        sink.log(events.Resume(round=ck.round, checkpoint=ck.path.name).to_dict())
    restarted = start is not None and start.restarted
    change = driver.algo.membership
    if restarted or change is not None:
        lost = max(0, start.last_round - (ck.round if ck is not None else 0)) if start is not None else 0
        driver.restarts += 1
        driver.rounds_lost += lost
        restart_s = time.time() - start.last_progress if start is not None and start.last_progress else None
        n = cfg.algorithm.workers
        ev = events.Membership(
            round=driver.round,
            workers=n,
            workers_before=change["workers_before"] if change else n,
            left=change["left"] if change else [],
            joined=change["joined"] if change else [],
            merged=change["merged"] if change else [],
            restart_s=restart_s,
            restarts=driver.restarts,
        )
        sink.log(ev.to_dict())
        what = (
            f"workers {ev.workers_before} -> {n}" + (f", trainers merged {ev.merged}" if ev.merged else "")
            if change
            else f"{n} workers"
        )
        took = f", {restart_s:.1f} s after the last progress" if restart_s is not None else ""
        say(f"membership: {what} (restart {driver.restarts}{took}; {lost} round(s) lost)")
    return run_dir, sink
