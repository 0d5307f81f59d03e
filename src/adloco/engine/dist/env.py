"""What the processes of a run learn from their environment: the names adloco sets for its own launcher,
and what torchrun's elastic agent says about the run."""

from __future__ import annotations

import os
from typing import Any

STORE_ENV = "ADLOCO_STORE"  # `adloco train --nproc`: the file store the processes meet through
LOOPBACK_ENV = "ADLOCO_LOOPBACK"  # `--nproc --max-restarts`: the process group's store on 127.0.0.1 only
NPROC_ENV = "ADLOCO_NPROC"  # the --nproc a run was started with (for the resume command it prints)
PROGRAM_ENV = "ADLOCO_PROGRAM"  # how the launching `adloco` was started (:func:`program`), for its processes


def program() -> str:
    """``adloco`` as this command was started, so that a command it prints runs as printed: ``adloco`` when
    PATH finds this very program, else its path as invoked (``.venv/bin/adloco`` after ``make train``), or
    this interpreter with ``-m adloco``; in processes ``adloco train --nproc`` started, the launcher's."""
    import shlex
    import shutil
    import sys
    from pathlib import Path

    if os.environ.get(PROGRAM_ENV):
        return os.environ[PROGRAM_ENV]
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name == "adloco":  # the console script
        found = shutil.which("adloco")
        if found is not None and Path(found).resolve() == Path(argv0).resolve():
            return "adloco"
        return shlex.quote(argv0)
    return f"{shlex.quote(sys.executable)} -m adloco"

def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def world_size() -> int | None:
    """How many processes torchrun (or ``adloco train --nproc``) started; None without a launcher."""
    return int(os.environ["WORLD_SIZE"]) if launched_by_torchrun() else None


def elastic_launch() -> dict[str, Any] | None:
    """torchrun's elastic agent with restarts (``--max-restarts`` ≥ 1): its run id (``--rdzv-id``) and how
    many times it restarted these processes; None otherwise."""
    if not launched_by_torchrun():
        return None
    max_restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if max_restarts < 1 or not run_id:
        return None
    return {
        "run_id": run_id,
        "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
        "max_restarts": max_restarts,
    }
