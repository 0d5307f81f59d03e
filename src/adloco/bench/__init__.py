"""``adloco bench``: the methods and ablations on identical data, model, seeds and example budget.

Each variant runs once per seed (``--seeds 0,1,2``, default: the config's ``algorithm.seed``) as an
ordinary run directory ``<out>/runs/<variant>[-g<k>]-s<seed>-<timestamp>``, each in its own process
(so peak memory is its own), up to ``--jobs`` at a time. Then ``<out>`` gets ``report.md``, plots
(:mod:`adloco.report.markdown`) and ``results.json``: every run's figures, their mean, min–max and 95%
t-interval over the seeds, the grid and the selection, for tables made elsewhere.

Grids: ``--sweep section.key=v1,v2`` (repeatable) gives every method a grid, the product of the values;
the config's ``bench.sweep`` gives one method its own (``{diloco: {outer.lr: [0.3, 0.7]}}``); on the
same key the command line wins. A method with a grid runs every setting on the first seed, is reported
at the setting chosen by ``--select`` (``ppl``: the lowest final validation perplexity; ``time``: the
least simulated time to the target; ``bytes``: the fewest bytes to it; runs that miss the target rank
after those that reach it, by final perplexity; ties: the first setting in grid order), and only that
setting runs on the other seeds. Ablations start from AdLoCo's selected setting.

Simulated time (``--compute``): ``examples`` (the default here) prices each worker's compute in a round
as its examples × one seconds-per-example constant shared by all runs (``--seconds-per-example``, or
the median over every worker event of every finished run), so that concurrent runs or a busy machine
do not change it; ``measured`` uses the measured compute times, as ``adloco report`` does.

A run that fails is reported (stderr, ``report.md``, ``results.json``; its exit code and last lines
of stderr in ``bench-failure.txt`` of its run folder, its whole output in ``<out>/logs``); the others
still run; runs that needed it (the other seeds of a method whose grid all failed, ablations of an
AdLoCo without a finished setting) are skipped and reported. Exit code: 0 when every run finished, 1
when some failed or were skipped (the report is written either way), 2 for bad input before any run.

The config file is an ordinary config for everything the variants share, plus an optional ``bench``
section: ``budget`` (training examples per variant), ``target`` (perplexity), ``seeds``, ``methods``
(per-method overrides, ``{diloco: {outer.lr: 0.7}}``, applied on top of the method's preset) and
``sweep`` (per-method grids).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from adloco.config import dump_yaml, load_yaml, parse_override, resolve
from adloco.errors import UserError

METHODS = ("adloco", "diloco", "localsgd", "ddp")
ABLATIONS: dict[str, list[str]] = {
    "no-adaptive": ["batch.test=none", "batch.statistics=false"],
    "no-merge": ["merge.policy=none"],
    "no-switch": ["switch.mode=cap"],
}
SELECT: dict[str, str] = {
    "ppl": "the lowest final validation perplexity",
    "time": "the least simulated time to the target",
    "bytes": "the fewest bytes communicated to the target",
}
# set by the bench for every run: not for --sweep
RESERVED = {
    "algorithm.method",
    "algorithm.seed",
    "algorithm.budget",
    "algorithm.rounds",
    "logging.name",
    "logging.out_dir",
    "logging.progress",
}
BENCH_KEYS = ("budget", "target", "seeds", "methods", "sweep")
TAIL = 20  # lines of a failed run's stderr kept in bench-failure.txt


def add_parser(sub: Any) -> None:
    from adloco.report import results

    b = sub.add_parser(
        "bench",
        help="run methods and ablations on one budget and several seeds, then compare them",
        description="Run methods and ablations on one example budget, once per seed, each method at its best "
        "setting of a grid when one is given, then compare them in report.md and results.json.",
        epilog="Exit code 0 when every run finished, 1 when some failed (the report says which), 2 for bad "
        "input.",
    )
    b.add_argument("--config", "-c", metavar="FILE", help="shared config, with an optional `bench` section")
    b.add_argument("--set", "-s", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    b.add_argument(
        "--methods", default="adloco,diloco,localsgd,ddp", help="comma-separated: " + ", ".join(METHODS)
    )
    b.add_argument("--ablations", default="", help="comma-separated: " + ", ".join(ABLATIONS))
    b.add_argument("--budget", type=int, help="training examples per variant (default: the bench section's)")
    b.add_argument(
        "--target",
        type=float,
        help="perplexity to reach (default: the bench section's, else the highest final one of any run)",
    )
    b.add_argument(
        "--seeds",
        metavar="S,S,...",
        help="run every variant once per seed (algorithm.seed); default: the bench section's seeds, else "
        "the config's one seed",
    )
    b.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="SECTION.KEY=V1,V2,...",
        help="a grid for every method (repeatable: the product); per-method grids go in the config's "
        "bench.sweep. Every setting runs on the first seed, the selected one alone on the others",
    )
    b.add_argument(
        "--select",
        choices=tuple(SELECT),
        default="ppl",
        help="how a grid's setting is chosen on the first seed: "
        + "; ".join(f"{k}: {v}" for k, v in SELECT.items())
        + " (time and bytes need a target); ties: the first in grid order (default: ppl)",
    )
    b.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=1,
        metavar="N",
        help="runs at once, each in its own process with runtime.threads=1 unless --set says otherwise "
        "(default 1: one after the other, each run's output shown)",
    )
    results.add_compute_options(b, "examples")
    b.add_argument("--out", help="comparison folder (default: <logging.out_dir>/bench-<timestamp>)")
    b.add_argument(
        "--report-only",
        metavar="BENCH_DIR",
        help="run nothing: write the report, plots and results.json of a finished bench again from its "
        "results.json and run directories, with --target, --compute, --seconds-per-example, --bandwidth "
        "and --latency (into --out, default BENCH_DIR itself; the selection stays as it was made)",
    )
    b.add_argument(
        "--bandwidth",
        type=float,
        help="with --report-only: simulated network, bytes per second (default: the runs')",
    )
    b.add_argument(
        "--latency",
        type=float,
        help="with --report-only: simulated network, seconds per hop (default: the runs')",
    )
    b.add_argument("--debug", action="store_true", help="show tracebacks")


def train_command() -> list[str]:
    """How a run is started (tests put a stand-in here)."""
    return [sys.executable, "-m", "adloco", "train"]


def prepare_data(cfg: Any) -> None:
    """Read and tokenize the shared data once, before runs start side by side and would each do it."""
    from adloco.data.tokens import prepare

    try:
        prepare(cfg.data, cfg.model.task, cfg.model.trust_remote_code, log=lambda m: print(f"bench: {m}"))
    except Exception as exc:  # every run meets it again and reports it as its own failure
        print(f"bench: preparing the data beforehand failed ({exc}); each run tries on its own", flush=True)


# -- what to run -------------------------------------------------------------------------------------


@dataclass
class Setting:
    """One point of a method's grid."""

    index: int
    sets: list[str]  # --set texts
    values: dict[str, Any] = field(default_factory=dict)  # key -> its resolved value

    def text(self, of: int = 1) -> str:
        words = ", ".join(f"{k}={v}" for k, v in self.values.items()) or "preset"
        return f"{words} (#{self.index} of {of})" if of > 1 else words


def _split(text: str, allowed: Any, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    for x in items:
        if x not in allowed:
            raise UserError(f"--{what} {text!r}: {x!r} is not one of {', '.join(allowed)}")
    if len(set(items)) != len(items):
        raise UserError(f"--{what} {text!r}: a variant is named twice")
    return items


def _seeds(given: Any, where: str) -> list[int]:
    items = [x.strip() for x in given.split(",")] if isinstance(given, str) else list(given)
    try:
        seeds = [int(x) for x in items if str(x).strip() != ""]
    except (TypeError, ValueError):
        raise UserError(f"{where} {given!r}: seeds are integers, e.g. 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds) or any(not 0 <= s < 2**31 for s in seeds):
        raise UserError(f"{where} {given!r}: distinct integers in [0, 2**31), e.g. 0,1,2")
    return seeds


def _key(key: str, where: str) -> str:
    key = key.strip()
    parse_override(f"{key}=0")  # section.key or one line of error
    if key in RESERVED:
        raise UserError(f"{where}: {key} is set by the bench for every run (seeds: --seeds), not swept")
    return key


def _grid_keys(
    args: argparse.Namespace, bench: dict[str, Any], where: str
) -> dict[str, dict[str, list[str]]]:
    """{method: {key: [--set value texts]}}: the config's bench.sweep, then --sweep for every method."""
    per = bench.get("sweep") or {}
    if not isinstance(per, dict) or set(per) - set(METHODS):
        raise UserError(f"{where}: bench.sweep: keys must be among {', '.join(METHODS)}")
    out: dict[str, dict[str, list[str]]] = {m: {} for m in METHODS}
    for m, grid in per.items():
        if not isinstance(grid, dict):
            raise UserError(f"{where}: bench.sweep.{m}: a mapping of section.key to a list of values")
        for k, values in grid.items():
            vals = values if isinstance(values, list) else [values]
            if not vals:
                raise UserError(f"{where}: bench.sweep.{m}.{k}: no values")
            out[m][_key(str(k), f"{where}: bench.sweep.{m}")] = [_yaml_value(v) for v in vals]
    for text in getattr(args, "sweep", None) or []:
        if "=" not in text:
            raise UserError(f"--sweep {text!r}: must look like section.key=v1,v2,...")
        k, _, raw = text.partition("=")
        vals = [v.strip() for v in raw.split(",")]
        if not any(vals) or not all(vals):
            raise UserError(f"--sweep {text!r}: give comma-separated values, e.g. outer.lr=0.3,0.5,0.7")
        k = _key(k, f"--sweep {text!r}")
        for m in METHODS:
            out[m][k] = vals
    return out


def variants(args: argparse.Namespace) -> tuple[dict[str, Any], list[tuple[str, list[str]]]]:
    """(bench settings, [(variant name, --set overrides at its preset)]); every variant's config is
    checked here, at every setting of its grid (``settings["grids"]``, per method)."""
    where = f"config file {args.config!r}"
    raw = load_yaml(args.config) if args.config else {}
    bench = raw.pop("bench", None) or {}
    if not isinstance(bench, dict) or set(bench) - set(BENCH_KEYS):
        raise UserError(f"{where}: the bench section holds {', '.join(BENCH_KEYS)} only")
    per_method = bench.get("methods") or {}
    if not isinstance(per_method, dict) or set(per_method) - set(METHODS):
        raise UserError(f"{where}: bench.methods: keys must be among {', '.join(METHODS)}")
    budget = args.budget if args.budget is not None else bench.get("budget")
    if budget is None or int(budget) < 1:
        raise UserError(
            "--budget: a positive number of training examples is needed (or bench.budget in the config)"
        )
    seeds_arg = getattr(args, "seeds", None)
    if seeds_arg is not None:
        seeds = _seeds(seeds_arg, "--seeds")
    elif bench.get("seeds") is not None:
        seeds = _seeds(bench["seeds"], f"{where}: bench.seeds")
    else:
        seeds = [resolve(None, args.overrides, base=raw).algorithm.seed]
    keys = _grid_keys(args, bench, where)
    out: list[tuple[str, list[str]]] = []
    methods = _split(args.methods, METHODS, "methods")
    ablations = _split(args.ablations, ABLATIONS, "ablations")
    if not methods and not ablations:
        raise UserError("--methods: nothing to run")

    def sets(method: str) -> list[str]:
        own = [f"{k}={_yaml_value(v)}" for k, v in (per_method.get(method) or {}).items()]
        return [f"algorithm.method={method}", *own, *args.overrides, f"algorithm.budget={int(budget)}"]

    out += [(m, sets(m)) for m in methods]
    out += [(f"adloco-{a}", sets("adloco") + ABLATIONS[a]) for a in ablations]
    owners = [*methods, *(["adloco"] if ablations else [])]
    grids: dict[str, list[Setting]] = {}
    for m in dict.fromkeys(owners):
        names = list(keys[m])
        combos = itertools.product(*(keys[m][k] for k in names))
        grids[m] = [
            Setting(i, [f"{k}={v}" for k, v in zip(names, c, strict=True)]) for i, c in enumerate(combos)
        ]
    if ablations and len(grids["adloco"]) > 1 and "adloco" not in methods:
        raise UserError(
            "--ablations: they start from AdLoCo's selected setting, so with a grid for adloco, "
            "--methods must include adloco"
        )
    # Every variant runs until the budget: enough rounds for the slowest consumer (a constant batch of
    # batch.initial on every worker), the same for all, so learning-rate schedules match.
    needed = 1
    for name, s in out:
        owner = "adloco" if name.startswith("adloco-") else name
        for g in grids[owner]:
            extra = ABLATIONS[name.removeprefix("adloco-")] if owner != name else []
            try:
                c = resolve(None, [*s[: len(sets(owner))], *g.sets, *extra], base=raw)
            except UserError as exc:
                label = f"variant {name}" + (f" at {', '.join(g.sets)}" if g.sets else "")
                raise UserError(f"{label}: {exc}") from None
            if owner == name or not g.values:  # a grid's keys, else the bench section's pins
                shown = [k.partition("=")[0] for k in g.sets] or [str(k) for k in per_method.get(owner) or {}]
                g.values = {k: _get(c, k) for k in shown}
            per_round = c.algorithm.workers * c.algorithm.inner_steps * c.batch.initial
            needed = max(needed, c.algorithm.rounds, -(-int(budget) // per_round))
    out = [(name, [*s, f"algorithm.rounds={needed}"]) for name, s in out]
    target = args.target if args.target is not None else bench.get("target")
    settings = {
        "raw": raw,
        "budget": int(budget),
        "target": None if target is None else float(target),
        "seeds": seeds,
        "grids": grids,
        "rounds": needed,
    }
    return settings, out


def _get(cfg: Any, key: str) -> Any:
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


def _yaml_value(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


@dataclass
class Task:
    """One run: a variant on one seed, at a setting known now or once its method's grid is chosen."""

    variant: str
    method: str  # whose grid gives its setting (adloco, for ablations)
    seed: int
    base: list[str]  # the variant's --set overrides before its setting
    extra: list[str]  # after it: an ablation's
    grid: int | None = None  # a grid run: its setting's index
    setting: Setting | None = None  # None: waits for the method's selection
    name: str = ""
    status: str = "queued"  # queued | running | ok | failed | skipped
    exit_code: int | None = None
    folder: Path | None = None  # its run directory (or the folder of its failure note)
    run: Any = None  # its results.Run once finished
    started: float = 0.0  # time.monotonic()
    seconds: float = 0.0
    wall: tuple[float, float] = (0.0, 0.0)  # started and finished, seconds since the epoch
    lines: list[str] = field(default_factory=list)  # the last lines of its stderr, or why skipped
    number: int = 0  # in the progress lines


def plan(settings: dict[str, Any], todo: list[tuple[str, list[str]]]) -> list[Task]:
    """Every run, in the order they start when they can: the first seed of every variant (the grids'
    settings included), then each further seed of every variant; a further seed of a method with a grid,
    and an ablation of an AdLoCo with a grid, waits for that grid's selection."""
    grids: dict[str, list[Setting]] = settings["grids"]
    seeds: list[int] = settings["seeds"]
    tasks: list[Task] = []
    for s in seeds:
        for name, sets in todo:
            ablation = name.startswith("adloco-")
            owner = "adloco" if ablation else name
            base, rounds = sets[: len(sets) - 1], sets[-1:]
            extra = ABLATIONS[name.removeprefix("adloco-")] if ablation else []
            if ablation:
                base = base[: len(base) - len(extra)]
            grid = grids[owner]
            if len(grid) == 1:
                tasks.append(Task(name, owner, s, base, [*extra, *rounds], setting=grid[0]))
            elif s == seeds[0] and not ablation:
                tasks += [Task(name, owner, s, base, rounds, grid=g.index, setting=g) for g in grid]
            else:
                tasks.append(Task(name, owner, s, base, [*extra, *rounds]))
    for t in tasks:
        if t.setting is not None:
            _name(t, grids)
    return tasks


def _name(t: Task, grids: dict[str, list[Setting]]) -> None:
    assert t.setting is not None
    g = f"-g{t.setting.index}" if len(grids[t.method]) > 1 and t.variant == t.method else ""
    t.name = f"{t.variant}{g}-s{t.seed}"


def select(candidates: Sequence[tuple[int, Any]], rule: str, target: float | None) -> int | None:
    """The index of the best setting by ``rule`` (:data:`SELECT`) among ``(index, results.Run or
    None)`` in grid order; a None (failed) setting is never chosen; ties: the first in grid order."""
    from adloco.report import results

    def key(run: results.Run) -> tuple[float, ...]:
        final = run.final if run.metric == "val_ppl" else -run.final
        if rule == "ppl":
            return (final,)
        if target is None:
            raise UserError(f"--select {rule}: needs a target (--target or bench.target)")
        got = results.reach(run, target)
        if got is None:
            return (1.0, final)
        return (0.0, got.sim_s if rule == "time" else float(got.bytes))

    best: tuple[tuple[float, ...], int] | None = None
    for index, run in candidates:
        if run is None:
            continue
        k = key(run)
        if best is None or k < best[0]:
            best = (k, index)
    return None if best is None else best[1]


# -- running -----------------------------------------------------------------------------------------


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
    def __init__(self, task: Task, cmd: list[str], env: dict[str, str], logs: Path, forward: bool):
        self.task = task
        self.cmd = cmd
        self.err_path = logs / f"{task.name}.err.log"
        self.files = [
            (logs / f"{task.name}.out.log").open("w", encoding="utf-8"),
            self.err_path.open("w", encoding="utf-8"),
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


def _run_dir(runs: Path, name: str) -> Path | None:
    pattern = re.compile(re.escape(name) + r"-\d{8}-\d{6}(-\d+)?")
    found = sorted(d for d in runs.iterdir() if d.is_dir() and pattern.fullmatch(d.name))
    return found[-1] if found else None


def _tail(path: Path, n: int = TAIL) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-n:]
    except OSError:
        return []


class Bench:
    """Runs the tasks, up to ``jobs`` at a time, choosing grid settings as grids finish."""

    def __init__(self, out: Path, tasks: list[Task], settings: dict[str, Any], args: argparse.Namespace):
        self.out, self.tasks, self.settings, self.args = out, tasks, settings, args
        self.jobs = args.jobs
        self.grids: dict[str, list[Setting]] = settings["grids"]
        self.chosen: dict[str, Setting | None] = {}
        self.selection_note: dict[str, str] = {}
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
        cmd = [*train_command(), "--config", str(self.out / "shared.yaml")]
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
                for t in self.tasks:
                    if len(self.running) >= self.jobs:
                        break
                    if t.status == "queued" and t.setting is not None:
                        self.start(t)
                if not self.running:
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

    def start(self, t: Task) -> None:
        self.started += 1
        t.number, t.status, t.started = self.started, "running", time.monotonic()
        t.wall = (time.time(), 0.0)
        setting = f" ({t.setting.text()})" if t.grid is not None and t.setting else ""
        self.say(t, f"started{setting}")
        self.running.append(_Child(t, self.command(t), self.env, self.out / "logs", forward=self.jobs == 1))

    def finish(self, c: _Child) -> None:
        from adloco.report import results

        t = c.task
        c.close()
        t.seconds = time.monotonic() - t.started
        t.wall = (t.wall[0], time.time())
        t.exit_code = c.proc.returncode
        t.folder = _run_dir(self.out / "runs", t.name)
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

    def resolve_selections(self) -> None:
        from adloco.report import results

        for method, grid in self.grids.items():
            if len(grid) == 1 or method in self.chosen:
                continue
            runs = [t for t in self.tasks if t.method == method and t.grid is not None]
            if not runs or any(t.status in ("queued", "running") for t in runs):
                continue
            finished = [t.run for t in self.tasks if t.run is not None]
            args = self.args
            spe = args.seconds_per_example
            if args.select == "time" and args.compute == "examples" and spe is None:
                results.price(finished, args.compute, None)
                spe = finished[0].seconds_per_example if finished else None
                if spe is not None:
                    self.selection_note[method] = (
                        f"{method}'s selection priced compute at {spe * 1e3:.4g} ms per example, the median "
                        f"over the {len(finished)} runs finished by then"
                    )
            elif finished:
                results.price(finished, args.compute, spe)
            index = select([(t.grid or 0, t.run) for t in runs], args.select, self.settings["target"])
            self.chosen[method] = None if index is None else grid[index]
            if index is None:
                print(
                    f"bench: no setting of {method}'s grid finished: its other runs are skipped", flush=True
                )
            else:
                print(f"bench: {method}: selected {grid[index].text(len(grid))} by {args.select}", flush=True)
            for t in self.tasks:
                if t.method != method or t.setting is not None:
                    continue
                if index is None:
                    self.started += 1
                    t.number, t.status = self.started, "skipped"
                    t.lines = [f"no setting of {method}'s grid finished on seed {self.settings['seeds'][0]}"]
                    self.say(t, f"skipped: {t.lines[0]}")
                else:
                    t.setting = grid[index]
                    _name(t, self.grids)

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
            f"bench: stopped; the runs so far are in {self.out / 'runs'} (no report: a stopped run resumes "
            "with adloco train --resume RUN_DIR)",
            file=sys.stderr,
            flush=True,
        )


class Terminated(Exception):
    """The bench got SIGTERM."""


# -- the report --------------------------------------------------------------------------------------


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.seconds_per_example is not None and not args.seconds_per_example > 0:
        raise UserError(f"--seconds-per-example {args.seconds_per_example}: must be > 0")
    if args.report_only is not None:
        return report_only(args, argv)
    if args.bandwidth is not None or args.latency is not None:
        raise UserError(
            "--bandwidth/--latency: only with --report-only (a bench sets its network with "
            "--set network.bandwidth=... and --set network.latency=...)"
        )
    settings, todo = variants(args)
    if args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: must be >= 1")
    if args.select != "ppl" and settings["target"] is None:
        raise UserError(f"--select {args.select}: needs a target (--target or bench.target)")
    shared = resolve(None, args.overrides, base=settings["raw"])
    out = Path(args.out or Path(shared.logging.out_dir) / f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {str(out)!r}: exists and is not empty (nothing is overwritten)")
    try:
        (out / "runs").mkdir(parents=True, exist_ok=True)
        (out / "logs").mkdir(exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {str(out)!r}: cannot be created ({exc.strerror})") from None
    (out / "shared.yaml").write_text(yaml.safe_dump(settings["raw"], sort_keys=False), encoding="utf-8")
    (out / "resolved.yaml").write_text(dump_yaml(shared), encoding="utf-8")
    tasks = plan(settings, todo)
    seeds = settings["seeds"]
    grid_runs = sum(len(g) for m, g in settings["grids"].items() if len(g) > 1 and m in dict(todo))
    print(
        f"bench: {len(todo)} variants x {len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
        + (f" ({grid_runs} grid settings on seed {seeds[0]})" if grid_runs else "")
        + f": {len(tasks)} runs of {settings['budget']:,} training examples, {args.jobs} at a time -> {out}",
        flush=True,
    )
    if args.jobs > 1:
        prepare_data(shared)
    bench = Bench(out, tasks, settings, args)
    try:
        bench.execute()
    except Terminated:
        return 128 + signal.SIGTERM
    report = _finish(_plan(bench, todo, "adloco " + shlex.join(argv)), out, args)
    print(f"report: {report}")
    bad = [t for t in tasks if t.status != "ok"]
    if bad:
        print(
            f"adloco: error: bench: {len(bad)} of {len(tasks)} runs did not finish: "
            + ", ".join(f"{t.variant} seed {t.seed} ({t.status})" for t in bad)
            + f" (see {report})",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


def report_only(args: argparse.Namespace, argv: list[str]) -> int:
    """``--report-only``: the report of a finished bench again, priced and targeted anew."""
    if args.bandwidth is not None and args.bandwidth <= 0:
        raise UserError(f"--bandwidth {args.bandwidth}: must be > 0 (bytes per second)")
    if args.latency is not None and args.latency < 0:
        raise UserError(f"--latency {args.latency}: must be >= 0 (seconds)")
    source = Path(args.report_only)
    plan = read_results(source)
    out = Path(args.out) if args.out else source
    if out.resolve() != source.resolve() and out.exists() and any(out.iterdir()):
        raise UserError(f"--out {str(out)!r}: exists and is not empty (nothing is overwritten)")
    plan["reported_by"] = "adloco " + shlex.join(argv)
    report = _finish(plan, out, args)
    print(f"report: {report}")
    return 0


def _entry(t: Task) -> dict[str, Any]:
    """A run as the report's plan holds it (paths absolute until written)."""
    return {
        "seed": t.seed,
        "name": t.name,
        "status": t.status,
        "exit_code": t.exit_code,
        "folder": t.folder,
        "seconds": round(t.seconds, 3),
        "started": t.wall[0] or None,
        "finished": t.wall[1] or None,
        **({"stderr_tail": t.lines} if t.status != "ok" else {}),
    }


def _plan(bench: Bench, todo: list[tuple[str, list[str]]], command: str) -> dict[str, Any]:
    """What the report says, before any figure: variants with their settings and runs, the grids,
    what failed. ``results.json`` is this plus the figures, so ``--report-only`` can rebuild it."""
    args, settings, tasks = bench.args, bench.settings, bench.tasks
    grids: dict[str, list[Setting]] = settings["grids"]
    seeds: list[int] = settings["seeds"]
    variants = []
    for name, _ in todo:
        owner = "adloco" if name.startswith("adloco-") else name
        grid = grids[owner]
        chosen = grid[0] if len(grid) == 1 else bench.chosen.get(owner)
        if chosen is None:
            text = "no setting finished"
        elif len(grid) == 1:
            text = chosen.text()
        else:
            text = ("AdLoCo's: " if owner != name else "") + chosen.text(len(grid))
        mine = [t for t in tasks if t.variant == name and (t.grid is None or t.setting is chosen)]
        mine.sort(key=lambda t: seeds.index(t.seed))
        variants.append(
            {
                "name": name,
                "method": owner if name == owner else "adloco",
                "setting": None if chosen is None else chosen.values,
                "setting_index": None if chosen is None or len(grid) == 1 else chosen.index,
                "setting_text": text,
                "seeds": list(seeds),
                "runs": [_entry(t) for t in mine],
            }
        )
    grid_plan = {}
    for m, grid in grids.items():
        if len(grid) == 1 or m not in dict(todo):
            continue
        grid_plan[m] = [
            {
                "index": t.setting.index,
                "setting": t.setting.values,
                "setting_text": t.setting.text(),
                "selected": bench.chosen.get(m) is t.setting,
                **_entry(t),
            }
            for t in tasks
            if t.method == m and t.grid is not None and t.setting is not None
        ]
    order = {name: k for k, (name, _) in enumerate(todo)}
    failed = [
        {"variant": t.variant, **_entry(t)}
        for t in sorted(tasks, key=lambda t: (order[t.variant], seeds.index(t.seed), t.grid or 0))
        if t.status in ("failed", "skipped")
    ]
    return {
        "command": command,
        "budget": settings["budget"],
        "rounds": settings["rounds"],
        "seeds": seeds,
        "target_given": settings["target"],
        "jobs": args.jobs,
        "select": {
            "rule": args.select,
            "text": SELECT[args.select],
            "notes": list(bench.selection_note.values()),
        },
        "intro": _intro(bench, todo),
        "variants": variants,
        "grids": grid_plan,
        "failed": failed,
    }


def _intro(bench: Bench, todo: list[tuple[str, list[str]]]) -> list[str]:
    args, settings = bench.args, bench.settings
    seeds = settings["seeds"]
    grids = {m: g for m, g in settings["grids"].items() if len(g) > 1}
    lines = [
        f"{len(todo)} variants, each run on seed{'s' if len(seeds) > 1 else ''} "
        f"{', '.join(map(str, seeds))} (`algorithm.seed`) with {settings['budget']:,} training examples "
        f"(the budget; at most {settings['rounds']} rounds), the same model, data and schedule; "
        f"{len(bench.tasks)} runs, {args.jobs} at a time"
        + (", each with `runtime.threads=1`." if bench.threads else ".")
        + " Each method's settings are its preset, with the bench section's `methods` overrides and `--set`"
        " on top, unless swept.",
        "",
    ]
    if grids:
        lines += [
            "Grids: "
            + "; ".join(
                f"{m}: {' × '.join(s.partition('=')[0] for s in g[0].sets)} ({len(g)} settings)"
                for m, g in grids.items()
            )
            + f". Every setting ran on seed {seeds[0]}; each method is reported at its best setting by "
            f"**{SELECT[args.select]}** on seed {seeds[0]}"
            + (
                " (runs that miss the target rank after those that reach it, by final perplexity)"
                if args.select != "ppl"
                else ""
            )
            + ", ties going to the first in grid order; that setting alone then ran on the other seeds "
            f"(its seed-{seeds[0]} run is the one it was chosen on, so that seed flatters it a little; the "
            "others do not). "
            + ("Ablations start from AdLoCo's selected setting. " if "adloco" in grids else "")
            + "Every setting's figures are in the grid tables below.",
            "",
        ]
        if bench.selection_note:
            lines += [" ".join(f"{note}." for note in bench.selection_note.values()), ""]
    return lines


def read_results(folder: Path, who: str = "--report-only") -> dict[str, Any]:
    """The plan of a finished bench, from its results.json (paths made absolute again); ``who`` opens
    the one line said when the folder holds none."""
    path = folder / "results.json"
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
        plan["variants"] = [{"name": k, **v} for k, v in plan["variants"].items()]
        for e in [
            *(e for v in plan["variants"] for e in v["runs"]),
            *(e for rows in plan["grids"].values() for e in rows),
            *plan["failed"],
        ]:
            e["folder"] = None if e.get("folder") is None else folder / e["folder"]
        plan["intro"], plan["target_given"]  # noqa: B018 -- present in a bench's results.json
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise UserError(f"{who} {str(folder)!r}: no readable results.json of adloco bench") from None
    return plan


def _finish(plan: dict[str, Any], out: Path, args: argparse.Namespace) -> Path:
    """Load the finished runs, price them together, write report.md, plots and results.json."""
    from adloco.report import markdown as reporting
    from adloco.report import results

    bandwidth, latency = getattr(args, "bandwidth", None), getattr(args, "latency", None)
    loaded: dict[Path, results.Run] = {}

    def load(e: dict[str, Any]) -> results.Run | None:
        if e["status"] != "ok" or e["folder"] is None:
            return None
        if e["folder"] not in loaded:
            loaded[e["folder"]] = results.load(e["folder"], bandwidth, latency)
        return loaded[e["folder"]]

    variants = [
        reporting.Variant(
            v["name"],
            v["method"],
            v["setting_text"],
            [r for r in map(load, v["runs"]) if r is not None],
            v["seeds"],
        )
        for v in plan["variants"]
    ]
    grid_runs = {m: [load(e) for e in rows] for m, rows in plan["grids"].items()}
    if loaded:
        results.price(list(loaded.values()), args.compute, args.seconds_per_example)
    compared = [r for v in variants for r in v.runs]
    target = args.target if args.target is not None else plan["target_given"]
    if target is None and compared:
        target = reporting.default_target(compared)
    grid_rows = {
        m: [
            reporting.GridRow(
                m,
                e["index"],
                e["setting_text"],
                run,
                "ok" if run is not None else f"failed (exit code {e['exit_code']})",
                e["selected"],
            )
            for e, run in zip(rows, grid_runs[m], strict=True)
        ]
        for m, rows in plan["grids"].items()
    }

    def rel(p: Path | None) -> str | None:
        return None if p is None else os.path.relpath(p, out)

    failed = [
        reporting.Failed(
            f["variant"], f["seed"], f["status"], f["exit_code"], rel(f["folder"]), f.get("stderr_tail", [])
        )
        for f in plan["failed"]
    ]
    again = plan.get("reported_by")
    report = reporting.write_bench(
        variants,
        out,
        target if target is not None else math.nan,
        intro=(
            [f"Reported again by `{again}`: the same runs and selection, priced and targeted as below.", ""]
            if again
            else []
        )
        + plan["intro"],
        grids=grid_rows,
        failed=failed,
        command=plan["command"],
        first_seed=plan["seeds"][0],
    )
    # results.json: the plan with every finished run's figures and each variant's aggregates
    first = next(iter(loaded.values()), None)

    def written(e: dict[str, Any]) -> dict[str, Any]:
        run = load(e)
        e = {**e, "folder": rel(e["folder"])}
        if run is not None and target is not None:
            e.update(reporting.figures(run, target), run=rel(run.path))
        return e

    document = {
        **plan,
        "target": target,
        "metric": first.metric if first else "val_ppl",
        "compute": {
            "mode": args.compute,
            "seconds_per_example": first.seconds_per_example if first else args.seconds_per_example,
            "source": first.compute_note if first else "",
        },
        "network": {"bandwidth": first.bandwidth, "latency": first.latency} if first else None,
        "variants": {
            v["name"]: {
                **{k: x for k, x in v.items() if k != "name"},
                "runs": [written(e) for e in v["runs"]],
                "aggregate": {
                    k: (None if st is None else st.to_dict())
                    for k, st in (
                        reporting.aggregate(var.runs, target) if var.runs and target else {}
                    ).items()
                },
                "reached": sum(results.reach(r, target) is not None for r in var.runs) if target else 0,
            }
            for v, var in zip(plan["variants"], variants, strict=True)
        },
        "grids": {m: [written(e) for e in rows] for m, rows in plan["grids"].items()},
        "failed": [written(f) for f in plan["failed"]],
    }
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return report
