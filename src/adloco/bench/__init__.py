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
:mod:`adloco.bench.grid`, run by :mod:`adloco.bench.runner` and written by :mod:`adloco.bench.writer`,
whose public names are re-exported here.
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
from adloco.bench.runner import TAIL, Bench, Terminated, eta, train_command
from adloco.bench.writer import _finish, _plan, read_results, report_only
from adloco.config import Config, dump_yaml, resolve
from adloco.config.load import yaml_value
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


def _check_resumable(
    out: Path,
    given: str | None,
    raw: dict[str, Any],
    shared: Config,
    overrides: list[str],
    optimizers: set[str],
) -> None:
    """--resume: ``out`` must be a bench folder made with the same shared settings. Its shared.yaml must be
    this command's config, but for keys added since the bench began (:data:`adloco.config.load.ADDED`)
    written out at the value it ran with (then shared.yaml and resolved.yaml are written again as this
    command's); and a bench made before such a key is refused under a config that would now run it at
    another value (its default changed), in one line naming the key. So is one whose resolved.yaml holds
    any other value this command would run otherwise (a default changed since, or a ``--set`` given then
    and not now, or now with another value): its runs would start over under settings it did not begin
    with. An inner key none of the bench's inner ``optimizers`` reads may differ (a run's config is
    compared without it too)."""
    if given is None:
        raise UserError("--resume: needs --out BENCH_DIR, the bench to go on with")
    if not (out / "shared.yaml").is_file() or not (out / "runs").is_dir():
        raise UserError(
            f"--out {given!r}: not a folder adloco bench made (no shared.yaml and runs/), nothing to resume"
        )
    shared_yaml = yaml.safe_dump(raw, sort_keys=False)
    stored_text = (out / "shared.yaml").read_text(encoding="utf-8")
    ran = _ran_with(out)  # the added keys as the bench ran them, where its resolved.yaml says
    now = shared.to_dict()
    for (section, key), was in ran.items():
        if now[section][key] != was:
            raise UserError(
                f"--resume: {given} ran with {section}.{key}: {yaml_value(was)}, whose default has changed since "
                f"(now {yaml_value(now[section][key])}): add `{key}: {yaml_value(was)}` under `{section}:` to its "
                f"config, or --set {section}.{key}={yaml_value(was)}, to go on as it began"
            )
    if stored_text != shared_yaml:
        stored = yaml.safe_load(stored_text) or {}
        written_out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
        for section, key in ran:
            if key in (written_out.get(section) or {}) and key not in (stored.get(section) or {}):
                del written_out[section][key]
                if not written_out[section]:
                    del written_out[section]
        if written_out != stored:
            raise UserError(
                f"--resume: {given}/shared.yaml differs from this command's config (a bench goes on with the "
                "settings it started with: run it with the command that made it, adding --resume)"
            )
    # the same config file: a value resolved otherwise comes from a default or a --set
    _check_same_resolution(out, given, yaml.safe_load(dump_yaml(shared)), overrides, optimizers)
    if stored_text == shared_yaml:
        return
    try:  # the same settings, written out: shared.yaml says them as this command does
        (out / "shared.yaml").write_text(shared_yaml, encoding="utf-8")
        (out / "resolved.yaml").write_text(dump_yaml(shared), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--out {given!r}: cannot be written ({exc.strerror})") from None
    print(f"bench: {given}/shared.yaml written again: this command's config, the settings the bench ran with")


# what a bench may go on with at another value: where runs log, and how many threads each uses (a run's
# results do not depend on them; the runner compares runs without them too)
_FREE_ON_RESUME = ("logging.", "runtime.threads")


def _check_same_resolution(
    out: Path, given: str, now: dict[str, Any], overrides: list[str], optimizers: set[str]
) -> None:
    """The bench's resolved.yaml against this command's resolution (``now``), key by key, its config file
    being the same (keys resolved.yaml lacks are :data:`adloco.config.load.ADDED`'s business): the first
    key whose value differs is refused in one line, saying how to go on as the bench began."""
    try:
        stored = yaml.safe_load((out / "resolved.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return
    if not isinstance(stored, dict):
        return
    from adloco.engine.describe import READ_BY

    named = {o.split("=", 1)[0].strip() for o in overrides}
    for section, values in now.items():
        was_section = stored.get(section)
        if not isinstance(values, dict) or not isinstance(was_section, dict):
            continue
        for key, value in values.items():
            name = f"{section}.{key}"
            if key not in was_section or name.startswith(_FREE_ON_RESUME):
                continue
            if section == "inner" and key in READ_BY and not optimizers & set(READ_BY[key]):
                continue  # read by no run of the bench
            was = was_section[key]
            if was == value:
                continue
            if name in named:
                why = (
                    f"this command sets {yaml_value(value)}: a bench goes on with the settings it began with"
                )
            else:
                why = (
                    f"this command would run {yaml_value(value)} (its default has changed since, or the command "
                    "that began the bench set it)"
                )
            raise UserError(
                f"--resume: {given} ran with {name}: {yaml_value(was)}; {why}: --set {name}={yaml_value(was)} "
                "goes on as it began"
            )


def _optimizers(
    shared: Config, overrides: list[str], todo: list[tuple[str, list[str]]], settings: dict[str, Any]
) -> set[str]:
    """The inner optimizers a bench's runs use: the shared config's and each one a variant, a grid or a
    derived variant sets."""
    texts = [*overrides, *(s for _, sets in todo for s in sets)]
    texts += [s for grid in settings["grids"].values() for point in grid for s in point.sets]
    texts += [s for d in settings.get("derived", {}).values() for s in d["sets"]]
    found = {str(shared.inner.optimizer)}
    for text in texts:
        key, _, value = text.partition("=")
        if key.strip() == "inner.optimizer":
            found.add(value.strip())
    return found


def _ran_with(out: Path) -> dict[tuple[str, str], Any]:
    """The keys of :data:`adloco.config.load.ADDED` that the bench in ``out`` began before (its
    resolved.yaml lacks them), each with the value it ran with; none where resolved.yaml does not read."""
    from adloco.config.load import ADDED

    try:
        resolved = yaml.safe_load((out / "resolved.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(resolved, dict):
        return {}
    return {
        (section, key): value
        for (section, key), value in ADDED.items()
        if isinstance(resolved.get(section), dict) and key not in resolved[section]
    }


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
        _check_resumable(
            out,
            args.out,
            settings["raw"],
            shared,
            args.overrides,
            _optimizers(shared, args.overrides, todo, settings),
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
