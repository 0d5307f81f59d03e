"""How runs are started: ``adloco bench``'s tasks, each in its own ``adloco train`` process (its output
logged under ``<out>/logs`` and, one job at a time, shown), up to ``--jobs`` at a time, a method's grid
selected as soon as its settings have finished, a failure noted in ``bench-failure.txt``, every run
stopped resumably on SIGINT or SIGTERM (:class:`Bench`); the estimate of the time left (:func:`eta`);
and one run as a script under ``benchmarks/`` starts it (:class:`Train`: the command line, the process,
the run directory it made, its summary and events as :class:`Finished`), so that a script holds only its
grid and its table."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import yaml

from adloco.bench.grid import Setting, Task, _name, select
from adloco.bench.resume import (
    comparable,
    config_as_resumed,
    finished_dirs,
    newest_checkpoint,
    run_dir,
    stopped_dirs,
)
from adloco.errors import UserError

TAIL = 20  # lines of a failed run's stderr kept in bench-failure.txt


def eta(durations: Sequence[float], running: Sequence[float], queued: int, jobs: int) -> float | None:
    """Seconds left: the mean duration of finished runs for each queued run and each running one (less
    its elapsed time), spread greedily over ``jobs`` slots; None before any run finished."""
    if not durations:
        return None
    mean = sum(durations) / len(durations)
    slots = sorted([max(mean - e, 0.0) for e in running] + [0.0] * max(jobs - len(running), 0))
    for _ in range(queued):
        slots[0] += mean
        slots.sort()
    return max(slots, default=0.0)


def _pump(stream: IO[str], log: IO[str], echo: IO[str] | None) -> None:
    for line in iter(stream.readline, ""):
        log.write(line)
        log.flush()
        if echo is not None:
            echo.write(line)
            echo.flush()
    stream.close()


class _Child:
    def __init__(
        self, task: Task, cmd: list[str], env: dict[str, str], logs: Path, forward: bool, folder: Path | None
    ):
        self.task = task
        self.cmd = cmd
        self.folder = folder  # the run directory it continues (--resume), or None: it makes its own
        self.err_path = logs / f"{task.name}.err.log"
        self.files = [
            (logs / f"{task.name}.out.log").open("a", encoding="utf-8"),  # a resumed bench keeps the old
            self.err_path.open("a", encoding="utf-8"),
        ]
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.threads = [
            threading.Thread(target=_pump, args=(s, f, e), daemon=True)
            for s, f, e in (
                (self.proc.stdout, self.files[0], sys.stdout if forward else None),
                (self.proc.stderr, self.files[1], sys.stderr if forward else None),
            )
        ]
        for th in self.threads:
            th.start()

    def close(self) -> None:
        for th in self.threads:
            th.join(timeout=10)
        for f in self.files:
            f.close()


def _tail(path: Path, n: int = TAIL) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]
    except OSError:
        return []


class Bench:
    """Runs the tasks, up to ``jobs`` at a time, choosing grid settings as grids finish."""

    def __init__(
        self,
        out: Path,
        tasks: list[Task],
        settings: dict[str, Any],
        args: argparse.Namespace,
        train: list[str],
    ):
        self.out, self.tasks, self.settings, self.args = out, tasks, settings, args
        self.train = train  # how a run is started: adloco.bench.train_command()
        self.jobs = args.jobs
        self.grids: dict[str, list[Setting]] = settings["grids"]
        self.chosen: dict[str, Setting | None] = {}
        self.selection_note: dict[str, str] = {}
        self.targets: dict[str, float] = {}  # the target each selection by time or bytes ranked by
        self.running: list[_Child] = []
        self.started = 0
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.threads: list[str] = []
        if self.jobs > 1:
            self.env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            if not any(o.strip().startswith("runtime.threads=") for o in args.overrides):
                self.threads = ["runtime.threads=1"]

    def sets(self, t: Task) -> list[str]:
        assert t.setting is not None
        return [*t.base, *t.setting.sets, *t.extra, f"algorithm.seed={t.seed}", *self.threads]

    def command(self, t: Task) -> list[str]:
        cmd = [*self.train, "--config", str(self.out / "shared.yaml")]
        runs = self.out / "runs"
        for s in [
            "logging.progress=plain",
            *self.sets(t),
            f"logging.out_dir={runs}",
            f"logging.name={t.name}",
        ]:
            cmd += ["--set", s]
        return cmd

    def say(self, t: Task, what: str) -> None:
        print(f"[{t.number}/{len(self.tasks)}] {t.variant} seed {t.seed} {what}", flush=True)

    def left(self) -> str:
        done = [t.seconds for t in self.tasks if t.status == "ok"] or [
            t.seconds for t in self.tasks if t.status == "failed"
        ]
        now = time.monotonic()
        queued = sum(t.status == "queued" for t in self.tasks)
        s = eta(done, [now - c.task.started for c in self.running], queued, self.jobs)
        return "" if s is None else f", about {s / 60:.0f} min left" if s >= 60 else f", about {s:.0f} s left"

    def execute(self) -> None:
        """Run every task; on SIGINT or SIGTERM the running runs are stopped (they write a checkpoint,
        resumable with ``adloco train --resume``) and KeyboardInterrupt or :class:`Terminated` raised."""

        def terminated(signum: int, frame: Any) -> None:
            raise Terminated

        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGTERM, terminated) if main else None
        try:
            while True:
                self.resolve_selections()
                kept = False
                for t in self.tasks:
                    if len(self.running) >= self.jobs:
                        break
                    if t.status == "queued" and t.setting is not None and t.wait is None:
                        if self.reuse(t):
                            kept = True
                        else:
                            self.start(t)
                if not self.running:
                    if kept:  # runs kept from an earlier go may finish a grid: its selection frees more
                        continue
                    break
                time.sleep(0.1)
                for c in [c for c in self.running if c.proc.poll() is not None]:
                    self.running.remove(c)
                    self.finish(c)
        except (KeyboardInterrupt, Terminated):
            self.stop()
            raise
        finally:
            if main:
                signal.signal(signal.SIGTERM, old)

    def reuse(self, t: Task) -> bool:
        """--resume: take the run of ``t`` that finished in an earlier go, if its config is the one ``t``
        runs now (one left unfinished is continued by :meth:`stopped`)."""
        if not getattr(self.args, "resume", False):
            return False
        from adloco.report import results

        expected = self.expected(t)
        for folder in finished_dirs(self.out / "runs", t.name):
            try:
                run = results.load(folder)
            except UserError:
                continue
            if config_as_resumed(folder) != expected:
                continue
            self.started += 1
            t.number, t.status, t.folder, t.run = self.started, "ok", folder, run
            t.seconds = float(run.summary.get("wall_s") or 0.0)
            self.say(t, f"finished before: {folder.name}")
            return True
        return False

    def expected(self, t: Task) -> dict[str, Any]:
        """The config ``t`` runs, as :func:`comparable` compares run directories' configs with it."""
        from adloco.config import dump_yaml, resolve

        return comparable(yaml.safe_load(dump_yaml(resolve(self.out / "shared.yaml", self.sets(t)))))

    def stopped(self, t: Task) -> tuple[Path, str] | None:
        """--resume: the newest run of ``t`` left unfinished in an earlier go (stopped by SIGTERM, or by a
        lost machine after a checkpoint) whose config is the one ``t`` runs now and that holds a complete
        checkpoint: (its directory, the checkpoint's name). It is continued with ``adloco train --resume``,
        which ends as the uninterrupted run would have; without one, ``t`` runs afresh beside it."""
        if not getattr(self.args, "resume", False):
            return None
        expected = None
        for folder in stopped_dirs(self.out / "runs", t.name):
            config = config_as_resumed(folder)
            expected = self.expected(t) if expected is None else expected
            if config is None or config != expected:
                continue
            at = newest_checkpoint(folder)
            if at is not None:
                return folder, at
        return None

    def start(self, t: Task) -> None:
        self.started += 1
        t.number, t.status, t.started = self.started, "running", time.monotonic()
        t.wall = (time.time(), 0.0)
        stopped = self.stopped(t)
        folder = None
        if stopped is None:
            cmd = self.command(t)
            setting = f" ({t.setting.text()})" if t.grid is not None and t.setting else ""
            self.say(t, f"started{setting}")
        else:
            folder, at = stopped
            (folder / "bench-failure.txt").unlink(missing_ok=True)  # its stop, noted then: the log keeps it
            cmd = [*self.train, "--resume", str(folder)]
            for s in self.threads:
                cmd += ["--set", s]
            self.say(t, f"continued: {folder.name} from its checkpoint {at}")
        self.running.append(
            _Child(t, cmd, self.env, self.out / "logs", forward=self.jobs == 1, folder=folder)
        )

    def finish(self, c: _Child) -> None:
        from adloco.report import results

        t = c.task
        c.close()
        t.seconds = time.monotonic() - t.started
        t.wall = (t.wall[0], time.time())
        t.exit_code = c.proc.returncode
        t.folder = c.folder or run_dir(self.out / "runs", t.name)
        why = ""
        if t.exit_code == 0:
            if t.folder is None:
                why = "it wrote no run directory"
            else:
                try:
                    t.run = results.load(t.folder)
                except UserError as exc:
                    why = str(exc)
        if t.exit_code == 0 and not why:
            t.status = "ok"
            self.say(t, f"finished in {t.seconds:.0f} s{self.left()}")
            return
        t.status = "failed"
        t.lines = _tail(c.err_path) + ([f"bench: {why}"] if why else [])
        if t.folder is not None and newest_checkpoint(t.folder) is not None:
            t.lines.append(
                "bench: it wrote a checkpoint: the command that started this bench, with --resume, continues it"
            )
        if t.folder is None:
            t.folder = self.out / "runs" / f"{t.name}-failed"
            t.folder.mkdir(parents=True, exist_ok=True)
        log = c.err_path.relative_to(self.out)
        (t.folder / "bench-failure.txt").write_text(
            f"variant {t.variant}, seed {t.seed}, run {t.name}\nexit code: {t.exit_code}\n"
            f"command: {shlex.join(c.cmd)}\n"
            f"last lines of its stderr (all of it: {log}):\n" + "".join(f"{x}\n" for x in t.lines),
            encoding="utf-8",
        )
        self.say(t, f"FAILED (exit code {t.exit_code}) after {t.seconds:.0f} s{self.left()}")
        print(
            f"adloco: error: bench: variant {t.variant} seed {t.seed} failed (exit code {t.exit_code}); "
            f"see {t.folder / 'bench-failure.txt'}",
            *(f"  {x}" for x in t.lines[-5:]),
            sep="\n",
            file=sys.stderr,
            flush=True,
        )

    def choice(self, method: str) -> Setting | None | Literal[False]:
        """``method``'s setting: its only one, the one selected, None when none finished, False while its
        grid is still running."""
        grid = self.grids[method]
        if len(grid) == 1:
            return grid[0]
        return self.chosen.get(method, False)

    def target(self) -> float | None | Literal[False]:
        """The target that selections by time or bytes rank by: the given number, or (``bench.target``
        naming a method) that method's final perplexity on the first seed at its chosen setting; None
        when that run failed, False while it has not finished."""
        ref = self.settings["target"]
        if not isinstance(ref, str):
            return ref
        chosen = self.choice(ref)
        if chosen is None:
            return None
        if chosen is False:
            return False
        first = self.settings["seeds"][0]
        for t in self.tasks:
            if t.variant == ref and t.seed == first and t.setting is chosen:
                if t.status in ("queued", "running"):
                    return False
                return None if t.run is None else float(t.run.final)
        return None

    def resolve_waits(self) -> None:
        """A derived variant's runs start from its parent's chosen setting, once it is chosen."""
        for t in self.tasks:
            if t.wait is None or t.status != "queued":
                continue
            chosen = self.choice(t.wait)
            if chosen is False:
                continue
            if chosen is None:
                self._skip_unchosen(t, t.wait)
                continue
            t.base, t.wait = [*t.base, *chosen.sets, *t.then], None

    def _skip_unchosen(self, t: Task, method: str) -> None:
        """``t`` skipped: it needed ``method``'s choice, and no setting of that grid finished on the first seed."""
        self.started += 1
        t.number, t.status = self.started, "skipped"
        t.lines = [f"no setting of {method}'s grid finished on seed {self.settings['seeds'][0]}"]
        self.say(t, f"skipped: {t.lines[0]}")

    def resolve_selections(self) -> None:
        from adloco.report import results

        self.resolve_waits()
        for method, grid in self.grids.items():
            if len(grid) == 1 or method in self.chosen:
                continue
            runs = [t for t in self.tasks if t.method == method and t.grid is not None]
            if not runs or any(t.status in ("queued", "running") for t in runs):
                continue
            rule = self.settings.get("rules", {}).get(method, self.args.select)
            target = self.target() if rule != "ppl" else None
            if target is False:
                continue  # the run that sets the target has not finished
            if rule != "ppl" and target is None:
                self.selection_note[method] = (
                    f"{method}'s grid was to be selected by {rule}, but the target's run failed: it was "
                    "selected by final perplexity"
                )
                rule = "ppl"
            finished = [t.run for t in self.tasks if t.run is not None]
            args = self.args
            spe = args.seconds_per_example
            if rule == "time" and args.compute == "examples" and spe is None and args.profile is None:
                results.price(finished, args.compute, None)
                spe = finished[0].seconds_per_example if finished else None
                if spe is not None:
                    self.selection_note[method] = (
                        f"{method}'s selection priced compute at {spe * 1e3:.4g} ms per example, the median "
                        f"over the {len(finished)} runs finished by then"
                    )
            elif finished:
                results.price(finished, args.compute, spe, args.profile, args.fixed_share)
            index = select([(t.grid or 0, t.run) for t in runs], rule, target or None)
            self.chosen[method] = None if index is None else grid[index]
            if rule != "ppl":
                self.targets[method] = float(target or 0.0)
            if index is None:
                print(
                    f"bench: no setting of {method}'s grid finished: its other runs are skipped", flush=True
                )
            else:
                at = f" to {target:.2f}" if rule != "ppl" and target else ""
                print(f"bench: {method}: selected {grid[index].text(len(grid))} by {rule}{at}", flush=True)
            for t in self.tasks:
                if t.method != method or t.setting is not None or t.status != "queued":
                    continue
                if index is None:
                    self._skip_unchosen(t, method)
                else:
                    t.setting = grid[index]
                    _name(t, self.grids)
        self.resolve_waits()  # a variant derived from a method chosen just now starts next

    def stop(self) -> None:
        """Stop the running runs with SIGTERM (a run takes the first signal only, so one that also got
        the terminal's SIGINT is not disturbed), give them time to write their checkpoints, then kill."""
        for c in self.running:
            if c.proc.poll() is None:
                c.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 120
        for c in self.running:
            try:
                c.proc.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
            c.close()
        print(
            f"bench: stopped; the runs so far are in {self.out / 'runs'} (no report: the command that "
            "started the bench, with --resume, keeps the finished runs and continues the stopped ones)",
            file=sys.stderr,
            flush=True,
        )


class Terminated(Exception):
    """The bench got SIGTERM."""


# -- one run, as a benchmark script starts it ------------------------------------------------------------


def train_command() -> list[str]:
    """How a run is started: ``adloco train`` in this Python (tests put a stand-in here)."""
    return [sys.executable, "-m", "adloco", "train"]


class RunFailed(SystemExit):
    """A run of :class:`Train` that ended with an exit code other than 0, or wrote no run directory: one
    message naming it, its command and the last lines of its stderr (a script that does not catch it
    ends with that message and exit code 1)."""


@dataclass
class Finished:
    """A run that finished: its directory, its ``summary.json``, and what it printed (when captured)."""

    folder: Path
    summary: dict[str, Any]
    stdout: str = ""

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The events of ``metrics.jsonl`` as dicts, in order; only those of ``kind`` when given."""
        lines = (self.folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        evs = [json.loads(line) for line in lines if line.strip()]
        return evs if kind is None else [e for e in evs if e.get("event") == kind]


class Train:
    """One ``adloco train`` run as a benchmark starts it: ``--config config`` (if any), then every
    ``section.key=value`` of ``sets`` as ``--set``, then ``logging.out_dir=out`` and ``logging.name=name``;
    in this process's Python, or as ``nproc`` local processes (``--nproc``, with ``--max-restarts``).
    ``env`` replaces the environment (default: this process's), ``command`` the ``adloco train`` part.

    :meth:`run` starts it and waits; or :meth:`start` it, watch it (:meth:`run_dir` is the directory it
    made, once there is one) and :meth:`result` it."""

    def __init__(
        self,
        sets: Sequence[str],
        out: Path,
        name: str,
        *,
        config: Path | None = None,
        nproc: int | None = None,
        max_restarts: int = 0,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self.out, self.name, self.cwd = Path(out), name, cwd
        self.env = dict(os.environ if env is None else env)
        argv = list(command if command is not None else train_command())
        if nproc is not None:
            argv += ["--nproc", str(nproc)] + (["--max-restarts", str(max_restarts)] if max_restarts else [])
        if config is not None:
            argv += ["--config", str(config)]
        for s in [*sets, f"logging.out_dir={self.out}", f"logging.name={name}"]:
            argv += ["--set", s]
        self.argv = argv
        self._before: set[str] = set()
        self.proc: subprocess.Popen[str] | None = None

    def start(self, **popen: Any) -> subprocess.Popen[str]:
        """Start the run (``popen``: :class:`subprocess.Popen`'s stdout, stderr, ...), noting the run
        directories already in ``out``: the one it makes is the new one."""
        self._before = {d.name for d in self.out.iterdir()} if self.out.is_dir() else set()
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, text=True, **popen)
        return self.proc

    def run_dir(self) -> Path | None:
        """The run directory this run made in ``out`` (``name-<timestamp>``, or ``name-<rdzv id>`` under
        the elastic agent), the newest if several; None before it exists."""
        if not self.out.is_dir():
            return None
        made = [
            d
            for d in self.out.iterdir()
            if d.is_dir() and d.name not in self._before and d.name.startswith(f"{self.name}-")
        ]
        return max(made, key=lambda d: (d.stat().st_mtime, d.name)) if made else None

    def run(self, stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE) -> Finished:
        """Start the run, wait for it, and return what it wrote (output captured unless told otherwise:
        ``subprocess.DEVNULL``, a file, or None for this process's own)."""
        proc = self.start(stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
        out, err = proc.communicate()
        return self.result(proc.returncode, out or "", err or "")

    def result(self, code: int, stdout: str = "", stderr: str = "") -> Finished:
        """What the run wrote, once it exited with ``code``; :class:`RunFailed` when it failed or left no
        finished run directory."""
        folder = self.run_dir()
        why = (
            f"exit code {code}"
            if code != 0
            else "it wrote no run directory"
            if folder is None
            else "no summary.json in its run directory"
            if not (folder / "summary.json").is_file()
            else ""
        )
        if why:
            tail = "".join(f"\n  {x}" for x in stderr.splitlines()[-TAIL:])
            raise RunFailed(f"{self.name}: failed ({why}): {shlex.join(self.argv)}{tail}")
        assert folder is not None
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        return Finished(folder, summary, stdout)
