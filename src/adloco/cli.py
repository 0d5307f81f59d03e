"""``adloco``: train | bench | report | analyze-gradients | profile | launch | simulate | config. Bad input (a config field, a file, a command
line argparse refuses) ends with one line on stderr and exit code 2.

Exit codes: 0 done, 2 bad input (or a disk that refused a checkpoint), 3 a distributed run lost a rank
(or ranks disagreed), 4 training failed on numerical faults (a checkpoint was written), 130 / 143 stopped
by SIGINT / SIGTERM (a checkpoint was written).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import typing
from collections.abc import Sequence

from adloco import __version__
from adloco.args import add_config_option, add_set_option
from adloco.errors import PeerFailed, UserError

EXIT_BAD_INPUT = 2
EXIT_DISTRIBUTED = 3
EXIT_FAILED = 4


class UsageError(Exception):
    """A command line argparse refused; ``prog`` is the (sub)command whose options it was parsing."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is raised (and reported as one line) instead of printed with usage."""

    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(message, self.prog)


def _config_args(p: argparse.ArgumentParser) -> None:
    add_config_option(
        p,
        "YAML config (sections as in `adloco config`; a `bench` section is read by `adloco bench` only, "
        "and ignored here)",
    )
    add_set_option(p, "override one field, e.g. --set batch.eta=0.5 (repeatable; wins over the file)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="adloco",
        description="Low-communication distributed training of language models: AdLoCo, DiLoCo, LocalSGD "
        "and DDP (synchronous data parallel) in one engine.",
        epilog="Every field of a config, its default, its allowed values and its doc: adloco config. "
        "Exit codes: 0 done, 2 bad input, 3 a distributed rank lost, 4 numerical faults, 130/143 stopped.",
    )
    parser.add_argument("--version", action="version", version=f"adloco {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser("train", help="train (with no arguments: AdLoCo on the embedded default)")
    _config_args(t)
    t.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="run N torch.distributed processes on this machine, reachable from it alone; "
        "for several machines use torchrun directly",
    )
    t.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="R",
        help="with --nproc: restart the processes up to R times when one fails (torch's elastic agent); "
        "each restart continues from the run's newest checkpoint",
    )
    from adloco.config import RESUMABLE_TEXT

    t.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its newest checkpoint (or from RUN_DIR/checkpoints/round-N) with its own "
        f"config.yaml: --config is refused, and --set may change only {RESUMABLE_TEXT}",
    )
    from adloco import bench
    from adloco.report import analysis

    bench.add_parser(sub)
    analysis.add_parser(sub)
    from adloco.engine import profiling

    profiling.add_parser(sub)
    from adloco.engine.dist import cluster

    cluster.add_parser(sub)
    from adloco.plan import command as simulate

    simulate.add_parser(sub)
    r = sub.add_parser("report", help="redraw plots and the comparison table from run directories alone")
    r.add_argument("runs", nargs="+", metavar="RUN_DIR")
    r.add_argument("--out", help="report folder (default: RUN_DIR/report for one run, else report-<time>)")
    r.add_argument("--target", type=float, help="perplexity to reach (default: the highest final one)")
    r.add_argument("--bandwidth", type=float, help="simulated network: bytes per second (default: the runs')")
    r.add_argument("--latency", type=float, help="simulated network: seconds per hop (default: the runs')")
    from adloco.report import results

    results.add_compute_options(r, "measured")
    r.add_argument("--debug", action="store_true", help="show tracebacks")
    c = sub.add_parser(
        "config",
        help="print the resolved config: every field with its allowed values and its one-line doc",
        description="Print the config `adloco train` would run with the same --config and --set: every field "
        "with its value, its allowed values (for a choice) and its doc. A `bench` section in the file is "
        "`adloco bench`'s and is left out.",
    )
    c.add_argument("section", nargs="?", metavar="SECTION", help="print only this section (e.g. batch)")
    _config_args(c)
    c.add_argument("--plain", action="store_true", help="YAML only, without the docs")
    return parser


def args_command(argv: Sequence[str]) -> str | None:
    """The command word of a command line: its first argument that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def _fmt(x: float | None) -> str:
    """A perplexity for people: a diverged run's (stored as null) prints as 'inf'."""
    return f"{x:.2f}" if x is not None else "inf"


def _launch(nproc: int, max_restarts: int, argv: Sequence[str]) -> int:
    """Re-run this command as ``nproc`` local torch.distributed processes; returns their exit code."""
    rest: list[str] = []
    it = iter(argv)
    for a in it:
        if a in ("--nproc", "--max-restarts"):
            next(it, None)  # and its value
        elif not a.startswith(("--nproc=", "--max-restarts=")):
            rest.append(a)
    from adloco.engine.dist import launch

    if max_restarts > 0:
        return launch.run_elastic(nproc, max_restarts, [*rest, "--set", "runtime.backend=torchdist"])
    return launch.run_local(nproc, [*rest, "--set", "runtime.backend=torchdist"])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        prog = exc.prog
        if prog == "adloco":  # options after the command are checked by the top parser: name the command
            command = args_command(argv)
            if command in _commands(parser):
                prog = f"adloco {command}"
        line = f"{exc} (see {prog} --help)"
        if str(exc).startswith("argument COMMAND: invalid choice"):
            line = f"unknown command {args_command(argv)!r} (commands: {', '.join(_commands(parser))})"
        print(f"adloco: error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    rank = int(os.environ.get("RANK", "0"))
    distributed = "WORLD_SIZE" in os.environ
    try:
        return COMMANDS[args.command](args, argv)
    except UserError as exc:
        if args.debug:
            raise
        if not isinstance(exc, PeerFailed) and (rank == 0 or _after_start(exc)):
            prefix = f"rank {rank}: " if distributed and rank != 0 else ""
            print(f"adloco: error: {prefix}{exc}", file=sys.stderr, flush=True)
        if distributed:
            sys.stderr.flush()
            if rank != 0:
                time.sleep(3)  # let rank 0 say why before the launcher tears the job down
            os._exit(EXIT_BAD_INPUT)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("adloco: interrupted", file=sys.stderr)
        return 130


def _resolved(args: argparse.Namespace) -> tuple[typing.Any, typing.Any]:
    """The command's resolved config and, with ``--resume``, the run and checkpoint it continues."""
    from adloco.config import resolve

    if getattr(args, "resume", None) is None:
        return resolve(args.config, args.overrides), None
    from pathlib import Path

    from adloco.engine.checkpoint import locate

    if args.config is not None:
        raise UserError(
            "--config: not with --resume (a run resumes with its own config.yaml; change fields with --set)"
        )
    resume = locate(Path(args.resume))
    return resolve(resume[0] / "config.yaml", args.overrides, resuming=True), resume


def _config(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``adloco config``: the resolved config, with each key's doc unless ``--plain``."""
    from adloco.config import dump_yaml

    cfg, _ = _resolved(args)
    sys.stdout.write(dump_yaml(cfg, with_docs=not args.plain, section=args.section))
    return 0


def _train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``adloco train``: in this process, or launched over ``--nproc`` processes; what a run that ended,
    stopped or failed prints, and its exit code."""
    cfg, resume = _resolved(args)
    if args.max_restarts and args.nproc is None:
        raise UserError("--max-restarts: needs --nproc (under torchrun, give torchrun --max-restarts)")
    if args.max_restarts < 0:
        raise UserError(f"--max-restarts {args.max_restarts}: must be >= 0")
    if args.nproc is not None:
        if args.nproc < 1:
            raise UserError(f"--nproc {args.nproc}: must be >= 1")
        if "WORLD_SIZE" in os.environ:
            raise UserError("--nproc: already running under torchrun; drop --nproc")
        from adloco.config.checks import check_layout

        rt = cfg.runtime
        flexible = resume is not None or args.max_restarts > 0  # workers follow the processes
        check_layout(cfg.algorithm.workers, args.nproc, rt.workers_per_process, rt.shards, flexible)
        return _launch(args.nproc, args.max_restarts, argv)
    from adloco.engine.train import DistributedFailure, Stopped, TrainingFailed, train

    try:
        run_dir, summary = train(cfg, resume)
    except DistributedFailure as exc:
        if args.debug:
            raise
        print(f"adloco: error: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_DISTRIBUTED)  # never wait on a process group that lost a member
    except Stopped as exc:
        if exc.run_dir is not None:
            print(_stopped_text(exc, cfg.logging.plots), file=sys.stderr, flush=True)
        return 128 + exc.signum
    except TrainingFailed as exc:
        if args.debug:
            raise
        if exc.run_dir is not None:
            print(
                f"adloco: error: {exc}; checkpoint {exc.saved} written\n"
                f"resume with: {_resume_command(exc.run_dir)} --set inner.lr=...",
                file=sys.stderr,
                flush=True,
            )
        return EXIT_FAILED
    if run_dir is not None and cfg.logging.plots:
        from adloco.report.plots import plot_run  # after the run, from its directory alone

        plot_run(run_dir)
    if run_dir is not None:
        if "final_val_accuracy" in summary:
            what = (
                f"validation accuracy {100 * (summary['initial_val_accuracy'] or 0):.2f}% -> "
                f"{100 * (summary['final_val_accuracy'] or 0):.2f}%"
            )
        else:
            what = f"validation perplexity {_fmt(summary['initial_val_ppl'])} -> {_fmt(summary['final_val_ppl'])}"
        from adloco.telemetry.progress import requests_text

        n = summary["trainers_final"]
        print(
            f"done: {what}, {n} trainer{'' if n == 1 else 's'} (requests {requests_text(summary['requests_final'])}), "
            f"{summary['wall_s']:.0f} s\nrun directory: {run_dir}"
        )
    return 0


def _bench(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from adloco import bench

    return bench.run(args, list(argv))


def _analyze(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from adloco.report import analysis

    return analysis.run(args)


def _profile(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from adloco.engine import profiling

    return profiling.command(args)


def _cluster(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from adloco.engine.dist import cluster

    return cluster.command(args)


def _simulate(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from adloco.plan import command as simulate

    return simulate.command(args)


# every subcommand's function (args, argv) -> exit code; main parses, dispatches and turns errors into lines
COMMANDS: dict[str, typing.Callable[[argparse.Namespace, Sequence[str]], int]] = {
    "train": _train,
    "config": _config,
    "bench": _bench,
    "report": lambda args, argv: _report(args),
    "analyze-gradients": _analyze,
    "profile": _profile,
    "launch": _cluster,
    "simulate": _simulate,
}


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from adloco.report import markdown as reporting
    from adloco.report import results

    if args.bandwidth is not None and args.bandwidth <= 0:
        raise UserError(f"--bandwidth {args.bandwidth}: must be > 0 (bytes per second)")
    if args.latency is not None and args.latency < 0:
        raise UserError(f"--latency {args.latency}: must be >= 0 (seconds)")
    paths = [Path(p) for p in args.runs]
    runs = results.load_all(
        paths,
        args.bandwidth,
        args.latency,
        args.compute,
        args.seconds_per_example,
        args.profile,
        args.fixed_share,
    )
    # one run: beside its own plots, never over them (they were drawn at the end of the run)
    out = (
        Path(args.out)
        if args.out
        else (paths[0] / "report" if len(paths) == 1 else Path(f"report-{time.strftime('%Y%m%d-%H%M%S')}"))
    )
    report = reporting.write(runs, out, args.target, command="adloco " + " ".join(sys.argv[1:]))
    print(f"report: {report}")
    return 0


def _stopped_text(exc: typing.Any, plots: bool) -> str:
    """What a stopped run left and how to go on (``exc``: :class:`adloco.engine.train.Stopped`), on rank 0;
    its plots drawn here, from its directory, when ``logging.plots`` asks (else the command that draws them)."""
    from adloco.engine.dist.env import program

    run_dir, s = exc.run_dir, exc.summary
    saved = f"{exc.where}/{exc.saved}" if exc.where else exc.saved
    lines = [f"adloco: {exc}: round {exc.round} undone; checkpoint written: {saved}"]
    if s:
        if "final_val_accuracy" in s:
            what = f"validation accuracy {100 * (s['final_val_accuracy'] or 0):.2f}%"
        else:
            what = f"validation perplexity {_fmt(s.get('initial_val_ppl'))} -> {_fmt(s.get('final_val_ppl'))}"
        lines.append(f"after {s['rounds']} round(s): {what}; summary: {run_dir / 'stopped.json'}")
    drawn = False
    if plots:
        from adloco.report.plots import plot_run

        try:
            plot_run(run_dir)
            drawn = True
            lines.append(f"plots: {run_dir / 'plots'}")
        except UserError:  # nothing logged to draw from yet
            pass
    if not drawn:
        lines.append(f"plots and report: {program()} report {shlex.quote(str(run_dir))}")
    lines.append(f"resume with: {_resume_command(run_dir)}")
    return "\n".join(lines)


def _resume_command(run_dir: object) -> str:
    from adloco.engine.dist.env import NPROC_ENV, program

    where = shlex.quote(str(run_dir))
    nproc = os.environ.get(NPROC_ENV)
    if nproc:
        return f"{program()} train --nproc {nproc} --resume {where}"
    if "WORLD_SIZE" in os.environ:
        return f"torchrun <the same options> -m adloco train --resume {where}"
    return f"{program()} train --resume {where}"


def _after_start(exc: UserError) -> bool:
    """Errors raised after the config was resolved can be one rank's own (its disk, its data)."""
    return not str(exc).startswith("config:")
