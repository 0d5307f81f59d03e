"""Command-line options several commands share, spelled once (no import beyond argparse: ``adloco --help``
builds every command's parser and must not wait for the config tree, let alone torch)."""

from __future__ import annotations

import argparse


def add_set_option(p: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--set SECTION.KEY=VALUE`` / ``-s``: repeatable, into ``args.overrides``, applied over the file."""
    p.add_argument(
        "--set", "-s", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help=help
    )


def add_config_option(p: argparse.ArgumentParser, help: str, required: bool = False) -> None:
    """``--config FILE`` / ``-c``: the YAML config the command reads (``help`` says what it takes from it)."""
    p.add_argument("--config", "-c", metavar="FILE", required=required, help=help)
