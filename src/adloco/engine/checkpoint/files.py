"""Full-state checkpoints: written atomically, read without executing anything.

A checkpoint is a folder ``<run>/checkpoints/round-NNNNNN/`` holding safetensors files (tensors) and
``state.json`` (everything else, plus the size and SHA-256 of every tensor file). It is the driver's
state dict laid out on disk (:func:`save` / :func:`load`): ``trainer-<t>.safetensors`` (θ, outer
momentum), ``worker-<w>.safetensors`` (inner optimizer state), ``rng.safetensors`` (each rank's
generators), and the rest in ``state.json``. It is assembled in a
hidden temporary folder, every file fsynced, and renamed into place in one step, so a folder named
``round-*`` is always complete; the oldest are deleted only after a newer one is in place. Loading
checks the manifest before anything is used: a truncated or altered file is refused, never half-read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from adloco.errors import UserError

FORMAT = 2
STATE = "state.json"
DIR = "checkpoints"


def name(round_: int) -> str:
    return f"round-{round_:06d}"


def folder(run_dir: Path) -> Path:
    return run_dir / DIR


def complete(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first."""
    d = folder(run_dir)
    if not d.is_dir():
        return []
    return sorted(
        p for p in d.iterdir() if p.is_dir() and p.name.startswith("round-") and (p / STATE).is_file()
    )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Writer:
    """Assembles one checkpoint (on rank 0): ``tensors`` per file, then ``finish`` with the metadata."""

    def __init__(self, run_dir: Path, round_: int) -> None:
        self.run_dir, self.round = run_dir, round_
        self.final = folder(run_dir) / name(round_)
        self.tmp = folder(run_dir) / f".tmp-{name(round_)}"
        self.files: dict[str, dict[str, Any]] = {}
        try:
            folder(run_dir).mkdir(exist_ok=True)
            if self.tmp.exists():
                shutil.rmtree(self.tmp)
            self.tmp.mkdir()
        except OSError as exc:
            self._fail(exc)

    def _write(self, filename: str, data: bytes) -> None:
        try:
            with (self.tmp / filename).open("wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            self._fail(exc)
        self.files[filename] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def tensors(self, filename: str, tensors: Mapping[str, torch.Tensor]) -> None:
        data = st_save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()})
        self._write(filename, data)

    def finish(self, meta: dict[str, Any], keep: int) -> Path:
        meta = {"format": FORMAT, "round": self.round, **meta, "files": self.files}
        self._write(STATE, (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode())
        del self.files[STATE]
        try:
            _fsync_dir(self.tmp)
            if self.final.exists():  # the same round written again (an interrupt right after it)
                shutil.rmtree(self.final)
            os.replace(self.tmp, self.final)
            _fsync_dir(self.final.parent)
        except OSError as exc:
            self._fail(exc)
        for old in complete(self.run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return self.final

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _fail(self, exc: OSError) -> None:
        self.abort()
        kept = [p.name for p in complete(self.run_dir)]
        previous = (
            f"the previous checkpoint {kept[-1]} is intact: free space, then resume with: "
            f"adloco train --resume {self.run_dir}"
            if kept
            else "no earlier checkpoint exists"
        )
        raise CheckpointWriteError(
            f"checkpoint {name(self.round)}: cannot write into {folder(self.run_dir)} "
            f"({exc.strerror or exc}); {previous}"
        ) from None


class CheckpointWriteError(UserError):
    """The disk refused a checkpoint; the previous one is untouched."""


class Checkpoint:
    """A checkpoint folder, verified against its manifest when opened."""

    def __init__(self, path: Path) -> None:
        self.path = path
        label = f"checkpoint {str(path)!r}"
        try:
            meta = json.loads((path / STATE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"{label}: no {STATE} (not a complete checkpoint)") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError(f"{label}: {STATE} is corrupt (not JSON)") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
            raise UserError(f"{label}: unknown format (this adloco reads format {FORMAT})")
        if meta.get("format") != FORMAT:
            raise UserError(
                f"{label}: written in checkpoint format {meta.get('format')} by an older adloco; this adloco "
                f"reads format {FORMAT} (finish that run with the adloco that started it)"
            )
        self.meta: dict[str, Any] = meta
        self._data: dict[str, bytes] = {}
        for filename, info in meta["files"].items():
            try:
                data = (path / filename).read_bytes()
            except OSError:
                raise UserError(f"{label}: {filename} is missing") from None
            if len(data) != info.get("bytes") or hashlib.sha256(data).hexdigest() != info.get("sha256"):
                what = "truncated" if len(data) < int(info.get("bytes", 0)) else "corrupt"
                raise UserError(f"{label}: {filename} is {what} (its size or checksum does not match)")
            self._data[filename] = data

    @property
    def round(self) -> int:
        return int(self.meta["round"])

    def tensors(self, filename: str) -> dict[str, torch.Tensor]:
        try:
            return st_load(self._data[filename])
        except KeyError:
            raise UserError(f"checkpoint {str(self.path)!r}: {filename} is missing") from None
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise UserError(f"checkpoint {str(self.path)!r}: {filename} is corrupt ({exc})") from None


def locate(path: Path) -> tuple[Path, Path]:
    """``--resume`` accepts a run directory (its newest checkpoint) or one checkpoint folder inside it.

    Returns (run directory, checkpoint folder)."""
    p = path.expanduser()
    if not p.exists():
        raise UserError(f"--resume {str(path)!r}: no such directory")
    if p.parent.name == DIR and (p.parent.parent / "config.yaml").is_file():
        if not (p / STATE).is_file():
            raise UserError(f"--resume {str(path)!r}: not a complete checkpoint (no {STATE})")
        return p.parent.parent, p
    if not (p / "config.yaml").is_file():
        raise UserError(f"--resume {str(path)!r}: not a run directory (no config.yaml)")
    found = complete(p)
    if not found:
        raise UserError(
            f"--resume {str(path)!r}: no checkpoint to resume from (one is written every checkpoint.every "
            "rounds and at the end)"
        )
    return p, found[-1]


def save(writer: Writer, state: dict[str, Any], config: dict[str, Any], keep: int) -> Path:
    """Lay the driver's state dict (:meth:`adloco.engine.driver.Driver.state_dict`) out as files."""
    algo = dict(state["algorithm"])
    for t, parts in sorted(algo.pop("trainers").items()):
        writer.tensors(f"trainer-{t}.safetensors", parts)
    replicas = {}
    for w, rep in sorted(algo.pop("replicas").items()):
        writer.tensors(f"worker-{w}.safetensors", rep["inner"])
        replicas[str(w)] = {"scalars": rep["scalars"], "inner": sorted(rep["inner"])}
    writer.tensors("rng.safetensors", state["rng"])
    algo["replicas"] = replicas
    return writer.finish({"algorithm": algo, "driver": state["driver"], "config": config}, keep)


def load(ck: Checkpoint) -> dict[str, Any]:
    """The driver's state dict back from a verified checkpoint."""
    algo = dict(ck.meta["algorithm"])
    algo["trainers"] = {int(t): ck.tensors(f"trainer-{t}.safetensors") for t in algo["requests"]}
    algo["replicas"] = {
        int(w): {
            "scalars": info["scalars"],
            "inner": ck.tensors(f"worker-{w}.safetensors") if info["inner"] else {},
        }
        for w, info in algo["replicas"].items()
    }
    return {"algorithm": algo, "rng": ck.tensors("rng.safetensors"), "driver": ck.meta["driver"]}
