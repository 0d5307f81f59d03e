"""``adloco bench``: the methods and ablations on identical data, model, seeds and example budget.

Each variant runs once per seed (``--seeds 0,1,2``, default: the config's ``algorithm.seed``) as an
ordinary run directory ``<out>/runs/<variant>[-g<k>]-s<seed>-<timestamp>``, each in its own process
(so peak memory is its own), up to ``--jobs`` at a time. Then ``<out>`` gets ``report.md``, plots
(:mod:`adloco.bench.writer`) and ``results.json``: every run's figures, their mean, min–max and 95%
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

This module holds the command's entry points (:func:`add_parser`, :func:`run`); what runs is planned in
:mod:`adloco.bench.grid`, run by :mod:`adloco.bench.runner` (gone on with, on ``--resume``, as
:mod:`adloco.bench.resume` allows) and written by :mod:`adloco.bench.writer`, whose public names are
re-exported here.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from adloco.args import add_config_option, add_set_option
from adloco.bench.grid import (
    ABLATIONS,
    BENCH_KEYS,
    METHODS,
    RESERVED,
    SELECT,
    Setting,
    Task,
    plan,
    select,
    variants,
)
from adloco.bench.resume import check_resumable
from adloco.bench.runner import TAIL, Bench, Terminated, eta, train_command
from adloco.bench.writer import _finish, _plan, read_results, report_only
from adloco.config import dump_yaml, resolve
from adloco.errors import UserError

__all__ = [
    "ABLATIONS",
    "BENCH_KEYS",
    "METHODS",
    "RESERVED",
    "SELECT",
    "TAIL",
    "Bench",
    "Setting",
    "Task",
    "Terminated",
    "add_parser",
    "eta",
    "plan",
    "prepare_data",
    "read_results",
    "report_only",
    "run",
    "select",
    "train_command",
    "variants",
]


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
    add_config_option(b, "shared config, with an optional `bench` section")
    add_set_option(b)
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
        "--resume",
        action="store_true",
        help="go on with the unfinished bench in --out, run again with the command that started it: a run "
        "that finished there with the config its task would run is kept, one stopped part-way (SIGTERM, "
        "Ctrl-C, or a lost machine after a checkpoint) is continued from its checkpoint, every other one "
        "runs afresh",
    )
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


def prepare_data(cfg: Any) -> None:
    """Read and tokenize the shared data once, before runs start side by side and would each do it."""
    from adloco.data.tokens import prepare

    try:
        prepare(cfg.data, cfg.model.task, cfg.model.trust_remote_code, log=lambda m: print(f"bench: {m}"))
    except Exception as exc:  # every run meets it again and reports it as its own failure
        print(f"bench: preparing the data beforehand failed ({exc}); each run tries on its own", flush=True)


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
    for method, rule in settings["rules"].items():
        if rule != "ppl" and settings["target"] is None and len(settings["grids"].get(method, [])) > 1:
            where = f"--select {rule}" if rule == args.select else f"bench.select.{method} = {rule!r}"
            raise UserError(f"{where}: needs a target (--target or bench.target)")
    if args.select != "ppl" and settings["target"] is None:
        raise UserError(f"--select {args.select}: needs a target (--target or bench.target)")
    shared = resolve(None, args.overrides, base=settings["raw"])
    out = Path(args.out or Path(shared.logging.out_dir) / f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    shared_yaml = yaml.safe_dump(settings["raw"], sort_keys=False)
    if args.resume:
        check_resumable(
            out,
            args.out,
            settings["raw"],
            shared,
            args.overrides,
            settings["optimizers"],
            settings["methods"],
        )
    elif out.exists() and any(out.iterdir()):
        raise UserError(
            f"--out {str(out)!r}: exists and is not empty (nothing is overwritten; --resume goes on with "
            "the bench there)"
        )
    try:
        (out / "runs").mkdir(parents=True, exist_ok=True)
        (out / "logs").mkdir(exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {str(out)!r}: cannot be created ({exc.strerror})") from None
    if not args.resume:
        (out / "shared.yaml").write_text(shared_yaml, encoding="utf-8")
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
    bench = Bench(out, tasks, settings, args, train_command())
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
