"""``adloco``: train | bench | report | analyze-gradients | config. Bad input ends with one line on stderr and exit code 2.

Exit codes: 0 done, 2 bad input (or a disk that refused a checkpoint), 3 a distributed run lost a rank
(or ranks disagreed), 4 training failed on numerical faults (a checkpoint was written), 130 / 143 stopped
by SIGINT / SIGTERM (a checkpoint was written).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from adloco.errors import UserError

EXIT_BAD_INPUT = 2
EXIT_DISTRIBUTED = 3
EXIT_FAILED = 4


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", metavar="FILE", help="YAML config (sections as in `adloco config`)")
    p.add_argument(
        "--set",
        "-s",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one field, e.g. --set batch.eta=0.5 (repeatable; wins over the file)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adloco",
        description="Low-communication distributed training: AdLoCo, DiLoCo and LocalSGD in one engine.",
    )
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
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its newest checkpoint (or from RUN_DIR/checkpoints/round-N); "
        "--set may change rounds, learning rates, eval, checkpoint, logging and runtime settings",
    )
    from adloco import analysis, bench

    bench.add_parser(sub)
    analysis.add_parser(sub)
    r = sub.add_parser("report", help="redraw plots and the comparison table from run directories alone")
    r.add_argument("runs", nargs="+", metavar="RUN_DIR")
    r.add_argument(
        "--out", help="comparison folder (default: the run itself for one run, else report-<time>)"
    )
    r.add_argument("--target", type=float, help="perplexity to reach (default: the highest final one)")
    r.add_argument("--bandwidth", type=float, help="simulated network: bytes per second (default: the runs')")
    r.add_argument("--latency", type=float, help="simulated network: seconds per hop (default: the runs')")
    r.add_argument("--debug", action="store_true", help="show tracebacks")
    c = sub.add_parser("config", help="print the resolved config, every field with its one-line doc")
    _config_args(c)
    c.add_argument("--plain", action="store_true", help="YAML only, without the docs")
    return parser


def _fmt(x: float | None) -> str:
    """A perplexity for people: a diverged run's (stored as null) prints as 'inf'."""
    return f"{x:.2f}" if x is not None else "inf"


def _launch(nproc: int, argv: Sequence[str]) -> int:
    """Re-run this command under torchrun with ``nproc`` local processes; returns torchrun's exit code."""
    rest: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--nproc":
            next(it, None)  # and its value
        elif not a.startswith("--nproc="):
            rest.append(a)
    from adloco.launch import run_local

    return run_local(nproc, [*rest, "--set", "runtime.backend=torchdist"])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    rank = int(os.environ.get("RANK", "0"))
    distributed = "WORLD_SIZE" in os.environ
    try:
        from adloco.config import dump_yaml, resolve

        if args.command == "bench":
            from adloco import bench

            return bench.run(args, argv)
        if args.command == "report":
            return _report(args)
        if args.command == "analyze-gradients":
            from adloco import analysis

            return analysis.run(args)
        resume = None
        if getattr(args, "resume", None) is not None:
            from pathlib import Path

            from adloco.checkpoint import locate

            if args.config is not None:
                raise UserError(
                    "--config: not with --resume (a run resumes with its own config.yaml; change fields with --set)"
                )
            resume = locate(Path(args.resume))
            cfg = resolve(resume[0] / "config.yaml", args.overrides)
        else:
            cfg = resolve(args.config, args.overrides)
        if args.command == "config":
            sys.stdout.write(dump_yaml(cfg, with_docs=not args.plain))
            return 0
        if args.nproc is not None:
            if args.nproc < 1:
                raise UserError(f"--nproc {args.nproc}: must be >= 1")
            if distributed:
                raise UserError("--nproc: already running under torchrun; drop --nproc")
            wpp = cfg.runtime.workers_per_process
            if cfg.algorithm.workers != args.nproc * wpp:
                raise UserError(
                    f"config: algorithm.workers = {cfg.algorithm.workers}: must equal processes ({args.nproc}) x "
                    f"runtime.workers_per_process ({wpp})"
                )
            return _launch(args.nproc, argv)
        from adloco.train import DistributedFailure, Stopped, TrainingFailed, train

        try:
            run_dir, summary = train(cfg, resume)
        except DistributedFailure as exc:
            if args.debug:
                raise
            print(f"adloco: error: {exc}", file=sys.stderr, flush=True)
            os._exit(EXIT_DISTRIBUTED)  # never wait on a process group that lost a member
        except Stopped as exc:
            if exc.run_dir is not None:
                print(
                    f"adloco: {exc}: checkpoint {exc.saved} written\nresume with: {_resume_command(exc.run_dir)}",
                    file=sys.stderr,
                    flush=True,
                )
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
        if run_dir is not None:
            if "final_val_accuracy" in summary:
                what = (
                    f"validation accuracy {100 * (summary['initial_val_accuracy'] or 0):.2f}% -> "
                    f"{100 * (summary['final_val_accuracy'] or 0):.2f}%"
                )
            else:
                what = f"validation perplexity {_fmt(summary['initial_val_ppl'])} -> {_fmt(summary['final_val_ppl'])}"
            print(
                f"done: {what}, "
                f"{summary['trainers_final']} trainer(s), requests {summary['requests_final']}, "
                f"{summary['wall_s']:.0f}s\nrun directory: {run_dir}"
            )
        return 0
    except UserError as exc:
        if args.debug:
            raise
        from adloco.engine.backends.torchdist import PeerFailed

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


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from adloco import compare
    from adloco.report import plot_run

    if args.bandwidth is not None and args.bandwidth <= 0:
        raise UserError(f"--bandwidth {args.bandwidth}: must be > 0 (bytes per second)")
    if args.latency is not None and args.latency < 0:
        raise UserError(f"--latency {args.latency}: must be >= 0 (seconds)")
    paths = [Path(p) for p in args.runs]
    runs = [compare.load(p, args.bandwidth, args.latency) for p in paths]
    if len(paths) == 1:
        plot_run(paths[0])
    out = (
        Path(args.out)
        if args.out
        else (paths[0] if len(paths) == 1 else Path(f"report-{time.strftime('%Y%m%d-%H%M%S')}"))
    )
    report = compare.write(runs, out, args.target, command="adloco " + " ".join(sys.argv[1:]))
    print(f"report: {report}")
    return 0


def _resume_command(run_dir: object) -> str:
    nproc = os.environ.get("ADLOCO_NPROC")
    if nproc:
        return f"adloco train --nproc {nproc} --resume {run_dir}"
    if "WORLD_SIZE" in os.environ:
        return f"torchrun <the same options> -m adloco train --resume {run_dir}"
    return f"adloco train --resume {run_dir}"


def _after_start(exc: UserError) -> bool:
    """Errors raised after the config was resolved can be one rank's own (its disk, its data)."""
    return not str(exc).startswith("config:")
