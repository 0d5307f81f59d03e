"""The run directory: where a run starts, where it continues from, and how rank 0 opens it.

A run started by hand gets ``<out_dir>/<name>-<timestamp>``. A run under torchrun's elastic agent (with
``--max-restarts`` ≥ 1) gets ``<out_dir>/<name>-<rdzv id>`` instead, so that when the agent restarts the
processes (a lost or a new machine), they find the run and continue from its newest complete
checkpoint on their own; launching again with the same ``--rdzv-id`` continues it too.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adloco import events
from adloco.config import RESUMABLE, RESUMABLE_TEXT, Config, dump_yaml
from adloco.config.load import as_it_ran
from adloco.engine import checkpoint
from adloco.engine.checkpoint.files import write_atomic
from adloco.errors import UserError
from adloco.telemetry.metrics import MetricsSink, make_sink, truncate_after

if TYPE_CHECKING:
    from adloco.engine.driver import Driver

# RESUMABLE (what --resume may change) and RESUMABLE_TEXT (the same in words) live in adloco.config, beside
# the fields they name; they are imported here, where a checkpoint's config is checked against them.


def check_resumable(cfg: Config, ck: checkpoint.Checkpoint) -> None:
    """Refuse a checkpoint written under another model, data or method (one line naming the field)."""
    saved = ck.meta.get("config")
    if not isinstance(saved, dict):
        raise UserError(f"checkpoint {str(ck.path)!r}: holds no config (not written by this adloco)")
    saved = as_it_ran(saved)  # a key added since reads as the value the run was made with
    now = cfg.to_dict()
    for section, values in now.items():
        for key, value in values.items():
            path = f"{section}.{key}"
            old = (saved.get(section) or {}).get(key, value)
            if old != value and not any(
                path == r or (r.endswith(".") and path.startswith(r)) for r in RESUMABLE
            ):
                raise UserError(
                    f"--resume: {path} = {value!r} differs from the checkpoint's {old!r}: a resumed run keeps its "
                    f"model, data and method (only {RESUMABLE_TEXT} may change)"
                )
    if cfg.algorithm.rounds < ck.round:
        raise UserError(
            f"config: algorithm.rounds = {cfg.algorithm.rounds}: the checkpoint is at round {ck.round} already"
        )


def check_out_dir(cfg: Config) -> None:
    """``logging.out_dir`` before anything is read or tokenized: a folder, or one that can be made where
    it is (its nearest existing parent a writable folder). Nothing is created here."""
    given = cfg.logging.out_dir
    path = Path(given).expanduser()
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if probe == path and not path.is_dir():
        raise UserError(
            f"config: logging.out_dir = {given!r}: a file, not a folder (name a folder for run directories)"
        )
    if not probe.is_dir():
        raise UserError(f"config: logging.out_dir = {given!r}: cannot be created (Not a directory)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"config: logging.out_dir = {given!r}: not writable")


def _parent(cfg: Config) -> Path:
    parent = Path(cfg.logging.out_dir).expanduser()
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"config: logging.out_dir = {cfg.logging.out_dir!r}: cannot be created ({exc.strerror})"
        ) from None
    if not os.access(parent, os.W_OK):
        raise UserError(f"config: logging.out_dir = {cfg.logging.out_dir!r}: not writable")
    return parent


def create(cfg: Config) -> Path:
    """``<out_dir>/<name>-<timestamp>`` (with a suffix if taken). Created only once input is valid."""
    parent = _parent(cfg)
    base = f"{cfg.logging.name or cfg.algorithm.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    for i in range(1000):
        path = parent / (base if i == 0 else f"{base}-{i}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise UserError(f"config: logging.out_dir = {cfg.logging.out_dir!r}: too many runs named {base!r}")


def elastic_path(cfg: Config, run_id: str, create: bool = True) -> Path:
    """``<out_dir>/<name>-<run id>``: the same on every restart of the run."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in run_id)[:100] or "run"
    parent = _parent(cfg) if create else Path(cfg.logging.out_dir).expanduser()
    return parent / f"{cfg.logging.name or cfg.algorithm.method}-{safe}"


def newest_round(
    cfg: Config, resume: tuple[Path, checkpoint.Folder | Path] | None, elastic: dict[str, Any] | None
) -> int:
    """The round of the newest checkpoint this machine's disk holds for the run (−1: none): how the
    processes of a restarted job find the one that kept the run directory."""
    found: Sequence[checkpoint.Folder | Path]
    if resume is not None:
        found = [resume[1]]
    elif elastic is not None:
        found = checkpoint.complete(elastic_path(cfg, elastic["run_id"], create=False), cfg.checkpoint.dir)
    else:
        return -1
    try:
        return int(found[-1].name.split("-")[-1]) if found else -1
    except ValueError:
        return -1


@dataclass
class Start:
    """Where rank 0 starts: a new run directory, or a run to continue from a checkpoint."""

    run_dir: Path | None  # None: create one once the input is known to be valid
    ck: checkpoint.Checkpoint | None
    restarted: bool  # an elastic restart (the agent started these processes again)
    last_round: int = 0  # the last round metrics.jsonl recorded (rounds after the checkpoint are lost)
    last_progress: float | None = None  # when metrics.jsonl was last written (a restart's start)


def locate(
    cfg: Config, resume: tuple[Path, checkpoint.Folder | Path] | None, elastic: dict[str, Any] | None
) -> Start:
    """Rank 0's decision: ``--resume`` (run directory, checkpoint), an elastic run's own directory and
    its newest complete checkpoint, or a new run. Checkpoints are verified and checked against the config;
    a ``logging.out_dir`` or ``checkpoint.dir`` that cannot be written is refused before anything is."""
    check_out_dir(cfg)
    if cfg.checkpoint.dir:
        why = checkpoint.probe(cfg.checkpoint.dir)
        if why is not None:
            raise UserError(f"config: checkpoint.dir = {cfg.checkpoint.dir!r}: cannot be written ({why})")
    if resume is not None:
        ck = checkpoint.Checkpoint(resume[1])
        check_resumable(cfg, ck)
        return Start(resume[0], ck, restarted=False, **_progress(resume[0]))
    if elastic is None:
        return Start(None, None, restarted=False)
    run_dir = elastic_path(cfg, elastic["run_id"])
    found = checkpoint.complete(run_dir, cfg.checkpoint.dir)
    restarted = int(elastic["restart_count"]) > 0 or run_dir.exists()
    if not found:
        return Start(run_dir, None, restarted=restarted, **_progress(run_dir))
    ck = checkpoint.Checkpoint(found[-1])
    check_resumable(cfg, ck)
    return Start(run_dir, ck, restarted=True, **_progress(run_dir))


def _progress(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    last = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if e.get("event") == "round":
            last = max(last, int(e.get("round", 0)))
    return {"last_round": last, "last_progress": path.stat().st_mtime}


def _relaid_schedule(cfg: Config, ck: checkpoint.Checkpoint, at: float) -> str | None:
    """One line when a resume changed ``algorithm.rounds`` under an lr schedule laid over the run's steps
    (warmup, cosine): from ``at`` (:meth:`Driver.lr_position`) the lr follows the new length, not the old."""
    from adloco.engine.inner import lr_at

    old = ((ck.meta.get("config") or {}).get("algorithm") or {}).get("rounds", cfg.algorithm.rounds)
    new, h = cfg.algorithm.rounds, cfg.algorithm.inner_steps
    was, now = lr_at(at, old * h, cfg.inner), lr_at(at, new * h, cfg.inner)
    if was == now:
        return None
    return (
        f"inner lr: its {cfg.inner.schedule} schedule now spans {new} rounds (the checkpoint's: {old}), so after "
        f"round {ck.round} it goes on at {now:.3g}, not {was:.3g} (inner.schedule constant, no warmup, "
        "continues it unchanged)"
    )


def open_run(
    cfg: Config, start: Start | None, driver: Driver, say: Callable[[str], None]
) -> tuple[Path, MetricsSink]:
    """Rank 0: the run directory (new, or the one continued), its config.yaml and metrics sink, and the
    events that say how this process started (a resume, a membership change)."""
    ck = start.ck if start is not None else None
    run_dir = start.run_dir if start is not None and start.run_dir is not None else create(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / "config.yaml", dump_yaml(cfg))
    if ck is not None:
        truncate_after(run_dir / "metrics.jsonl", ck.round)
        say(f"resuming {run_dir} from {ck.path.name} (round {ck.round} of {cfg.algorithm.rounds})")
        relaid = _relaid_schedule(cfg, ck, driver.lr_position())
        if relaid:
            say(relaid)
    elif start is not None and start.restarted:  # restarted before its first checkpoint: start over here
        truncate_after(run_dir / "metrics.jsonl", -1)
        say(f"run directory {run_dir} (restarted before its first checkpoint: from the start)")
    else:
        say(f"run directory {run_dir}")
    sink = make_sink(run_dir, cfg.logging, cfg.to_dict())
    if ck is not None:
        sink.log(events.Resume(round=ck.round, checkpoint=ck.path.name).to_dict())
    restarted = start is not None and start.restarted
    change = driver.algo.view.membership
    if restarted or change is not None:
        lost = max(0, start.last_round - (ck.round if ck is not None else 0)) if start is not None else 0
        driver.restarts += 1
        driver.rounds_lost += lost
        restart_s = time.time() - start.last_progress if start is not None and start.last_progress else None
        n = cfg.algorithm.workers
        ev = events.Membership(
            round=driver.round,
            workers=n,
            workers_before=change["workers_before"] if change else n,
            left=change["left"] if change else [],
            joined=change["joined"] if change else [],
            merged=change["merged"] if change else [],
            restart_s=restart_s,
            restarts=driver.restarts,
        )
        sink.log(ev.to_dict())
        what = (
            f"workers {ev.workers_before} -> {n}" + (f", trainers merged {ev.merged}" if ev.merged else "")
            if change
            else f"{n} workers"
        )
        took = f", {restart_s:.1f} s after the last progress" if restart_s is not None else ""
        say(f"membership: {what} (restart {driver.restarts}{took}; {lost} round(s) lost)")
    return run_dir, sink
