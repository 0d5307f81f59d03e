"""``adloco train``: check -> place -> build -> train -> close. Nothing here is algorithmic.

The same function runs in-process and in every torch.distributed process; rank 0 alone prints progress
and writes the run directory, from numbers gathered from every rank. Each step is its own place: what the
config asks of the machine is :func:`adloco.config.checks.check_placement`; the process group and the
device :mod:`adloco.engine.placement`; the run directory :mod:`adloco.engine.rundir`; a checkpoint's
state :mod:`adloco.engine.checkpoint`; signals :mod:`adloco.engine.signals`; the rounds
:class:`adloco.engine.driver.Driver`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from adloco import events, models
from adloco.config import Config
from adloco.config.checks import check_placement, cuda_graphs_choice
from adloco.data.tokens import Data, prepare
from adloco.engine import compiling, rundir
from adloco.engine.checkpoint.files import Folder
from adloco.engine.checkpoint.saver import Checkpointer
from adloco.engine.describe import describe_run, muon_note, unread_note
from adloco.engine.driver import Driver, TooManyBadRounds
from adloco.engine.placement import Placement, place
from adloco.engine.signals import Signals
from adloco.events import Summary
from adloco.library.comm.base import CommFailure
from adloco.library.method import DecisionMismatch, RoundAborted
from adloco.library.presets import outer_note
from adloco.telemetry.metrics import MetricsSink
from adloco.telemetry.progress import Progress, library_log_to, make_progress


class DistributedFailure(Exception):
    """A rank died, hung or disagreed: the message is one line naming the rank and the round."""


class Stopped(Exception):
    """SIGINT or SIGTERM: the run stopped at the end of an inner step, undid the round in progress, and
    wrote a checkpoint of the last whole round (``saved``, in ``where``) and, on rank 0, its summary."""

    def __init__(
        self,
        signum: int,
        round_: int,
        run_dir: Path | None,
        saved: str,
        where: str | None = None,
        summary: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} in round {round_}")
        self.signum, self.round, self.run_dir, self.saved = signum, round_, run_dir, saved
        self.where, self.summary = where, summary or {}


class TrainingFailed(Exception):
    """Numerical faults persisted; a checkpoint of the last (finite) state was written."""

    def __init__(self, message: str, run_dir: Path | None, saved: str) -> None:
        super().__init__(message)
        self.run_dir, self.saved = run_dir, saved


def train(
    cfg: Config, resume: tuple[Path, Folder | Path] | None = None
) -> tuple[Path | None, dict[str, Any]]:
    """Train as configured; returns the run directory (None on ranks other than 0) and the summary.

    ``resume``: (run directory, checkpoint folder) to continue from (see :func:`adloco.engine.checkpoint.locate`).
    Under torchrun's elastic agent (``--max-restarts`` ≥ 1) a run continues from its own newest
    checkpoint after a restart, with the number of workers the restart brought.
    """
    from adloco.engine.dist import env

    world = env.world_size()
    check_placement(cfg, world, flexible=env.elastic_launch() is not None or resume is not None)
    run = Run(place(cfg, resume), resume)
    try:
        summary = run.train()
    finally:
        run.close()
    return run.run_dir, summary


class Run:
    """One run of ``adloco train`` in this process, once placed: :meth:`train` builds the driver and
    the run directory, runs the rounds and writes what a finished run leaves; :meth:`close` lets go of
    what it holds, the process group only after a run that finished."""

    def __init__(self, where: Placement, resume: tuple[Path, Folder | Path] | None) -> None:
        self.where, self.cfg, self.comm, self.resume = where, where.cfg, where.comm, resume
        self.progress: Progress = make_progress(self.cfg.logging.progress) if where.root else Progress()
        self.say = self.progress.message
        self._log = library_log_to(self.say)  # the library's warnings as progress lines, on rank 0
        self._log.__enter__()
        self.driver: Driver | None = None
        self.run_dir: Path | None = None
        self.finished = False

    def train(self) -> dict[str, Any]:
        with self._failures():
            self._say_graphs()
            data, start = self._data()
            compiled = compiling.CacheCounts.now() if self.cfg.runtime.compile else None
            driver = self.driver = self._driver(data, start)
            run_dir, sink = (
                rundir.open_run(self.cfg, start, driver, self.say)
                if self.where.root
                else (None, MetricsSink())
            )
            self.run_dir = run_dir
            if run_dir is not None and self.cfg.logging.trace:
                driver.trace_dir = run_dir / "trace"  # logging.trace: rank 0 records that round
            summary = self._rounds(driver, sink)
            if compiled is not None:  # what compiling cost: graphs, and what the caches already held
                self.say(compiling.CacheCounts.now().since(compiled).line())
            self._write(driver, data, summary)
        self.finished = True
        return summary.to_dict()

    def close(self) -> None:
        self._log.__exit__(None, None, None)
        if self.finished:
            self.where.close()

    @contextlib.contextmanager
    def _failures(self) -> Iterator[None]:
        """A collective that failed, or ranks that disagreed, as one line naming the rank and the round."""
        ctx = self.where.ctx
        try:
            yield
        except CommFailure as exc:
            if ctx is None:
                raise
            from adloco.engine.dist import join

            r = self.driver.round + 1 if self.driver is not None else 0
            raise DistributedFailure(join.failure_line(ctx, exc, r)) from exc
        except DecisionMismatch as exc:
            raise DistributedFailure(f"rank {self.comm.rank}: {exc}") from exc

    def _say_graphs(self) -> None:
        """The run's first line: whether its workers' steps are CUDA graphs, and why (``runtime.cuda_graphs``,
        ``auto`` resolved as :func:`adloco.engine.build.build_algorithm` resolves it)."""
        on, why = cuda_graphs_choice(self.cfg, self.where.device.type == "cuda")
        if on and why.startswith("auto"):
            n = len(self.comm.local_workers)
            why += f", {n} worker{'s' if n != 1 else ''} on one device"
        self.say(f"cuda graphs: {'on' if on else 'off'} ({why})")

    def _data(self) -> tuple[Data, rundir.Start | None]:
        """The tokens, and (rank 0) where the run starts. Everything that can fail on bad input happens
        before the run directory exists; rank 0 goes first (where the run continues from, tokenizer
        training, caches) and the others follow, or stop if it failed."""
        from adloco.engine.dist import join

        cfg, ctx = self.cfg, self.where.ctx
        start: rundir.Start | None = None

        def load() -> Data:
            return prepare(cfg.data, cfg.model.task, cfg.model.trust_remote_code, log=self.say)

        def on_root() -> Data:
            nonlocal start
            start = rundir.locate(cfg, self.resume, self.where.elastic)
            return load()

        if ctx is None:
            return on_root(), start
        data = join.root_first(ctx, on_root, cfg.runtime.timeout, others=load)
        join.check_same_data(ctx.comm, data.arrays())
        return data, start

    def _driver(self, data: Data, start: rundir.Start | None) -> Driver:
        """The driver (models, the algorithm object), continued from the checkpoint rank 0 found."""
        from adloco.engine.checkpoint.state import restore

        cfg, a, comm, device = self.cfg, self.cfg.algorithm, self.comm, self.where.device
        factory = models.factory_for(cfg.model, cfg.data.seq_len, data)
        ck = start.ck if start is not None else None
        chosen = (ck.meta.get("driver") or {}).get("inner_optimizer") if ck is not None else None
        driver = Driver(cfg, comm, data, factory, device, log=self.say, resumed_optimizer=chosen)
        if self.where.threads is not None:  # runtime.threads 0 in one process: follow the free cores
            self.where.threads.log = self.say
            driver.between_steps = self.where.threads.check
        wait = cfg.elastic.timeout if self.where.elastic is not None else cfg.runtime.timeout
        if not restore(driver, start.ck if start is not None else None, wait) and a.trainers > a.workers:
            self.say(
                f"algorithm.trainers = {a.trainers}: this launch has {a.workers} workers; starting with "
                f"{a.workers} trainers"
            )
        ctx = self.where.ctx
        procs = f", {comm.world} processes x {ctx.threads} thread(s)" if ctx is not None else ""
        unit = f"blocks of {cfg.data.seq_len} tokens" if data.task == "causal_lm" else "labelled examples"
        where = device.type
        if ctx is None and device.type == "cpu":
            follows = " (fewer while other work holds cores)" if self.where.threads is not None else ""
            where += f", {torch.get_num_threads()} thread(s){follows}"
        for line in describe_run(
            cfg,
            driver.n_params,
            f"{data.n_train} train / {data.n_val} validation {unit}",
            where,
            procs,
            ns_dtype=driver.inner.muon_ns_dtype,
            optimizer=driver.inner.optimizer,
            kept=chosen is not None,
        ):
            self.say(line)
        if (note := outer_note(a.method, cfg.outer, cfg.comm)) is not None:
            self.say(note)
        running = dataclasses.replace(cfg, inner=driver.inner)  # the inner optimizer as it runs
        for note in (muon_note(running, device.type), unread_note(running)):
            if note is not None:
                self.say(note)
        return driver

    def _rounds(self, driver: Driver, sink: MetricsSink) -> Summary:
        """The rounds, with a checkpoint every ``checkpoint.every`` rounds (every ``elastic.checkpoint_every``
        under the elastic agent) and at the end; a signal stops the run at the end of an inner step with a
        checkpoint (:class:`Stopped`), persistent numerical faults with one of the last finite state
        (:class:`TrainingFailed`)."""
        from adloco.engine import checkpoint

        cfg, run_dir = self.cfg, self.run_dir
        every = cfg.elastic.checkpoint_every if self.where.elastic is not None else cfg.checkpoint.every
        where = checkpoint.location(run_dir, cfg.checkpoint.dir) if run_dir is not None else None
        saver = Checkpointer(
            driver,
            cfg.to_dict,
            where,
            run_dir,
            sink,
            cfg.checkpoint.keep,
            background=cfg.checkpoint.async_save,
        )

        def after_round(final: bool) -> None:
            if final or (every > 0 and driver.round % every == 0):
                saver.save(wait=final)

        def acknowledge(signum: int) -> None:  # in the signal handler, at once: what happens now
            if not self.where.root:
                return
            r = driver.round
            kept = ["stopped.json", *(["plots"] if cfg.logging.plots else [])]
            at = f"checkpoint {where}/{checkpoint.name(r)}, " if where is not None else ""
            print(
                f"\nadloco: {signal.Signals(signum).name} received: stopping at the end of this inner step; round "
                f"{r + 1} will be undone and the run saved as of round {r} ({at}{', '.join(kept)}); another "
                "signal is ignored while it saves",
                file=sys.stderr,
                flush=True,
            )

        try:
            with Signals(acknowledge) as signals:
                driver.stop_requested = lambda: signals.signum is not None
                try:
                    summary = driver.run(sink, self.progress, after_round)
                except RoundAborted as exc:
                    self.progress.close()
                    assert signals.signum is not None or self.comm.world > 1
                    signum = signals.signum or signal.SIGTERM
                    saved = saver.save(wait=True)
                    stopped = driver.summary(stopped=signal.Signals(signum).name)
                    sink.log(events.End(driver.round, stopped).to_dict())
                    if run_dir is not None:
                        # not summary.json: that one says a run finished (bench, report and scripts read so)
                        rundir.write_atomic(
                            run_dir / "stopped.json", json.dumps(stopped.to_dict(), indent=2) + "\n"
                        )
                    raise Stopped(signum, exc.round, run_dir, saved, where, stopped.to_dict()) from None
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
                self.progress.close()
        return summary

    def _write(self, driver: Driver, data: Data, summary: Summary) -> None:
        """What a finished run leaves in its directory (rank 0): the reported trainer's model in Hugging
        Face form (``logging.save_model``), the run's own profile fit (``runtime.profile: auto``; ``adloco
        report --profile`` takes it) and ``summary.json``. Every rank takes part in gathering the model."""
        run_dir = self.run_dir
        if self.cfg.logging.save_model:
            path = None if run_dir is None else run_dir / "model"
            mb = self.cfg.logging.model_file_mb
            driver.save_trainer(summary.reported_trainer, path, data.tokenizer, mb * 2**20)
        if run_dir is None:
            return
        if driver.auto_profile and driver.profile is not None:
            driver.profile.save(run_dir / "profile.json")
        rundir.write_atomic(run_dir / "summary.json", json.dumps(summary.to_dict(), indent=2) + "\n")
        (run_dir / "stopped.json").unlink(missing_ok=True)  # an earlier stop's, continued to the end
