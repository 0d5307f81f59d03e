"""Every ``adloco`` command the README and the docs show runs as written as far as this process can tell
without training: the command line parses, and its ``--config`` (a file of the repository) and ``--set``
values resolve to a config. Placeholders (``<run>``, ``...``) and shell loops are left out; what only a
run shows is in tests/e2e (the examples, the demo, the MLflow viewer)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from adloco.cli import build_parser
from adloco.config import resolve

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "benchmarks" / "RESULTS.md"]
SHELL = re.compile(r"\s(?:\||;|&&|2>&1|>)\s.*$")  # a pipe, a loop's `; done`, a redirection


def documented() -> list[tuple[str, str]]:
    """(page, command line after ``adloco``) of every ``adloco`` command in a bash block."""
    out = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = SHELL.sub("", line.split(" #")[0].strip())
                m = re.search(r"(?:^|\s)(?:-m\s+)?adloco\s+(.*)$", line)
                if m and not any(p in line for p in ("<", "...", "[--set", "$")):
                    out.append((str(page.relative_to(ROOT)), m.group(1)))
    return out


COMMANDS = documented()


def test_the_pages_show_commands() -> None:
    assert len(COMMANDS) > 50 and any(c.startswith("train --set sync.overlap") for _, c in COMMANDS)


@pytest.mark.parametrize("page,command", COMMANDS, ids=[f"{p}: {c[:60]}" for p, c in COMMANDS])
def test_a_documented_command_parses_and_its_config_resolves(page: str, command: str) -> None:
    args = build_parser().parse_args(shlex.split(command))
    if args.command in ("train", "config") and not getattr(args, "resume", None):
        file = args.config if args.config and (ROOT / args.config).is_file() else None  # my.yaml: yours
        resolve(ROOT / file if file else None, args.overrides)
