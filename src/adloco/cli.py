"""``adloco``: train | config. Bad input ends with one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from adloco.errors import UserError

EXIT_BAD_INPUT = 2


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
    c = sub.add_parser("config", help="print the resolved config, every field with its one-line doc")
    _config_args(c)
    c.add_argument("--plain", action="store_true", help="YAML only, without the docs")
    return parser


def _fmt(x: float | None) -> str:
    """A perplexity for people: a diverged run's (stored as null) prints as 'inf'."""
    return f"{x:.2f}" if x is not None else "inf"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        from adloco.config import dump_yaml, resolve

        cfg = resolve(args.config, args.overrides)
        if args.command == "config":
            sys.stdout.write(dump_yaml(cfg, with_docs=not args.plain))
            return 0
        from adloco.train import train

        run_dir, summary = train(cfg)
        print(
            f"done: validation perplexity {_fmt(summary['initial_val_ppl'])} -> {_fmt(summary['final_val_ppl'])}, "
            f"{summary['trainers_final']} trainer(s), requests {summary['requests_final']}, "
            f"{summary['wall_s']:.0f}s\nrun directory: {run_dir}"
        )
        return 0
    except UserError as exc:
        if args.debug:
            raise
        print(f"adloco: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("adloco: interrupted", file=sys.stderr)
        return 130
