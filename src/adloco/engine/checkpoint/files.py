"""Checkpoints on storage: where they are, how one is completed, verified and found again.

A checkpoint is a folder ``round-NNNNNN`` in the run's checkpoint location: ``<run>/checkpoints``, or
``<checkpoint.dir>/<run directory's name>`` where ``checkpoint.dir`` is set (a path or an fsspec URL). It
holds one torch.distributed.checkpoint (DCP) checkpoint, every rank's own tensors in its own files
(:mod:`.storage`), and ``state.json``: the run-level state (the round, the algorithm's replicated
decisions, the driver's counters, the config) and the size and SHA-256 of every file beside it.

Every rank writes into a hidden ``.tmp-round-NNNNNN``; once every rank's files are complete, rank 0
moves the folder to ``round-NNNNNN`` and writes ``state.json`` last, so a folder with a ``state.json`` is
always complete; the oldest are deleted only after a newer one is complete. Loading checks the manifest
before anything is used: a truncated or altered file is refused, never half-read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adloco.errors import UserError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

FORMAT = 3
STATE = "state.json"
DIR = "checkpoints"
_METADATA = ".metadata"  # DCP's table of tensors


def name(round_: int) -> str:
    return f"round-{round_:06d}"


def is_url(where: str) -> bool:
    return "://" in where


def filesystem(where: str) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem of a path or URL, and the path in it."""
    from fsspec.core import url_to_fs

    return url_to_fs(where)  # type: ignore[no-any-return]


def location(run_dir: Path, dir: str = "") -> str:
    """A run's checkpoint location: ``<run>/checkpoints``, or ``<dir>/<run directory's name>``."""
    if not dir:
        return str(run_dir / DIR)
    return f"{dir.rstrip('/')}/{run_dir.name}" if is_url(dir) else str(Path(dir).expanduser() / run_dir.name)


def configured_dir(run_dir: Path) -> str:
    """``checkpoint.dir`` of the run's own config.yaml ('' when unset or unreadable)."""
    import yaml

    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        got = (saved.get("checkpoint") or {}).get("dir") or ""
    except (OSError, AttributeError, yaml.YAMLError):
        return ""
    return str(got)


def probe(where: str) -> str | None:
    """Create ``where`` and write and delete a small file there: None when that worked, else why not."""
    try:
        fs, path = filesystem(where)
        fs.makedirs(path, exist_ok=True)
        mark = _join(path, f".probe-{os.getpid()}")
        fs.pipe_file(mark, b"")
        fs.rm(mark)
    except (OSError, ValueError) as exc:
        return str(getattr(exc, "strerror", None) or exc)
    return None


@dataclass(frozen=True)
class Folder:
    """A checkpoint folder: a local path or a URL."""

    url: str

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[0]

    def join(self, filename: str) -> str:
        return f"{self.url.rstrip('/')}/{filename}"

    def __str__(self) -> str:
        return self.url


def _join(where: str, filename: str) -> str:
    return f"{where.rstrip('/')}/{filename}"


def complete(run_dir: Path | str, dir: str = "") -> list[Folder]:
    """The complete checkpoints of a run (its directory, or a checkpoint location as a string), oldest first."""
    where = location(run_dir, dir) if isinstance(run_dir, Path) else run_dir
    try:
        fs, root = filesystem(where)
        if not fs.isdir(root):
            return []
        names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
        return [
            Folder(_join(where, n))
            for n in names
            if n.startswith("round-") and fs.isfile(_join(root, f"{n}/{STATE}"))
        ]
    except (OSError, ValueError):
        return []


def _sha256(fs: AbstractFileSystem, path: str) -> dict[str, Any]:
    h, size = hashlib.sha256(), 0
    with fs.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": h.hexdigest()}


def own_files(tmp: str, rank: int) -> dict[str, dict[str, Any]]:
    """The size and SHA-256 of every file rank ``rank`` wrote into a checkpoint folder (DCP names them
    ``__<rank>_<n>.distcp``; rank 0 also writes ``.metadata``)."""
    fs, root = filesystem(tmp)
    mine = f"__{rank}_"
    out = {}
    for p in sorted(fs.ls(root, detail=False)):
        base = p.rstrip("/").rsplit("/", 1)[-1]
        if base.startswith(mine) or (rank == 0 and base == _METADATA):
            out[base] = _sha256(fs, _join(root, base))
    return out


class Writer:
    """One checkpoint: rank 0 prepares the hidden folder every rank writes into (:attr:`tmp`), and
    completes it (:meth:`finish`) once every rank's files are written, or removes it (:meth:`abort`)."""

    def __init__(self, where: str, round_: int, run_dir: Path | None = None) -> None:
        self.where, self.round, self.run_dir = where, round_, run_dir
        self.final = _join(where, name(round_))
        self.tmp = _join(where, f".tmp-{name(round_)}")

    def prepare(self) -> None:
        """Rank 0, before any rank writes: a fresh hidden folder."""
        try:
            fs, _ = filesystem(self.where)
            fs.makedirs(filesystem(self.where)[1], exist_ok=True)
            tmp = filesystem(self.tmp)[1]
            if fs.exists(tmp):
                fs.rm(tmp, recursive=True)
        except OSError as exc:
            self.fail(exc)

    def finish(self, meta: dict[str, Any], files: dict[str, dict[str, Any]], keep: int) -> Folder:
        """Rank 0, once every rank's files are written: the folder moved into place, ``state.json`` last,
        the oldest checkpoints beyond ``keep`` deleted."""
        meta = {"format": FORMAT, "round": self.round, **meta, "files": files}
        text = json.dumps(meta, indent=1, sort_keys=True) + "\n"
        try:
            fs, final = filesystem(self.final)
            tmp = filesystem(self.tmp)[1]
            if fs.exists(final):  # the same round written again (an interrupt right after it)
                fs.rm(final, recursive=True)
            fs.mv(tmp, final, recursive=True)
            if is_url(self.final):
                fs.pipe_file(_join(final, STATE), text.encode())
            else:
                write_atomic(Path(final) / STATE, text)
                _fsync_dir(Path(final))
                _fsync_dir(Path(final).parent)  # the checkpoint folder's own rename into place
        except OSError as exc:
            self.fail(exc)
        for old in complete(self.where)[:-keep]:
            with contextlib.suppress(OSError):
                fs.rm(filesystem(old.url)[1], recursive=True)
        return Folder(self.final)

    def abort(self) -> None:
        try:
            fs, tmp = filesystem(self.tmp)
            if fs.exists(tmp):
                fs.rm(tmp, recursive=True)
        except OSError:
            pass

    def fail(self, exc: BaseException) -> None:
        """Raise the one line a refused write gives (the previous checkpoint is untouched)."""
        self.abort()
        raise CheckpointWriteError(self.message(exc)) from None

    def message(self, exc: BaseException) -> str:
        from adloco.engine.dist.env import program

        kept = [p.name for p in complete(self.where)]
        previous = (
            f"the previous checkpoint {kept[-1]} is intact: free space, then resume with: {program()} train "
            f"--resume {self.run_dir if self.run_dir is not None else 'RUN_DIR'}"
            if kept
            else "no earlier checkpoint exists"
        )
        why = getattr(exc, "strerror", None) or str(exc)
        return f"checkpoint {name(self.round)}: cannot write into {self.where} ({why}); {previous}"


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all: written beside it, synced, then renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointWriteError(UserError):
    """The storage refused a checkpoint; the previous one is untouched."""


class Checkpoint:
    """A checkpoint folder: its ``state.json`` read and every file's size checked when opened; the
    checksums by :meth:`verify` (every rank a share of the files, when it is loaded)."""

    def __init__(self, path: Folder | Path | str) -> None:
        self.path = path if isinstance(path, Folder) else Folder(str(path))
        label = f"checkpoint {str(self.path)!r}"
        fs, root = filesystem(self.path.url)
        try:
            raw = fs.cat_file(_join(root, STATE))
            meta = json.loads(raw.decode("utf-8"))
        except (FileNotFoundError, IsADirectoryError):
            raise UserError(f"{label}: no {STATE} (not a complete checkpoint)") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError(f"{label}: {STATE} is corrupt (not JSON)") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("files"), dict):
            raise UserError(f"{label}: unknown format (this adloco reads format {FORMAT})")
        if meta.get("format") != FORMAT:
            raise UserError(
                f"{label}: written in checkpoint format {meta.get('format')} by an older adloco; this adloco "
                f"reads format {FORMAT} (torch.distributed.checkpoint): finish that run with the adloco that "
                "started it, or start it again"
            )
        self.meta: dict[str, Any] = meta
        for filename, info in meta["files"].items():
            try:
                size = fs.size(_join(root, filename))
            except (FileNotFoundError, OSError):
                raise UserError(f"{label}: {filename} is missing") from None
            if size != info.get("bytes"):
                what = "truncated" if size < int(info.get("bytes", 0)) else "corrupt"
                raise UserError(f"{label}: {filename} is {what} (its size or checksum does not match)")

    @property
    def round(self) -> int:
        return int(self.meta["round"])

    @property
    def url(self) -> str:
        return self.path.url

    def tensor(self, key: str) -> Any:
        """One tensor of the checkpoint whole (``trainer/<t>/theta``, ...; None if it holds none), read in
        this process alone: for tools that inspect a checkpoint, not for resuming."""
        from adloco.engine.checkpoint import storage

        saved = storage.tensors(storage.metadata(self.url)).get(key)
        if saved is None:
            return None
        import torch

        into = {key: torch.zeros(saved[0], dtype=saved[1])}
        storage.read(into, self.url, None)
        return into[key]

    def verify(self, share: int = 0, of: int = 1) -> str | None:
        """Check the checksums of every ``of``-th file from the ``share``-th; the first mismatch in words."""
        return verify(self.path.url, self.meta["files"], share, of)


def verify(where: str, files: dict[str, dict[str, Any]], share: int = 0, of: int = 1) -> str | None:
    """The checksums of files ``share``, ``share + of``, ... of a checkpoint's manifest; None when they match,
    else the refusal in one line."""
    fs, root = filesystem(where)
    for filename in sorted(files)[share::of]:
        info = files[filename]
        try:
            got = _sha256(fs, _join(root, filename))
        except (FileNotFoundError, OSError):
            return f"checkpoint {where!r}: {filename} is missing"
        if got != {"bytes": info.get("bytes"), "sha256": info.get("sha256")}:
            what = "truncated" if got["bytes"] < int(info.get("bytes", 0)) else "corrupt"
            return f"checkpoint {where!r}: {filename} is {what} (its size or checksum does not match)"
    return None


def locate(path: Path) -> tuple[Path, Folder]:
    """``--resume`` accepts a run directory (its newest checkpoint, wherever ``checkpoint.dir`` put it) or
    one checkpoint folder inside its ``checkpoints``.

    Returns (run directory, checkpoint folder)."""
    p = path.expanduser()
    if not p.exists():
        raise UserError(f"--resume {str(path)!r}: no such directory")
    if p.parent.name == DIR and (p.parent.parent / "config.yaml").is_file():
        if not (p / STATE).is_file():
            raise UserError(f"--resume {str(path)!r}: not a complete checkpoint (no {STATE})")
        return p.parent.parent, Folder(str(p))
    if not (p / "config.yaml").is_file():
        raise UserError(f"--resume {str(path)!r}: not a run directory (no config.yaml)")
    found = complete(p, configured_dir(p))
    if not found:
        raise UserError(
            f"--resume {str(path)!r}: no checkpoint to resume from (one is written every checkpoint.every "
            "rounds and at the end)"
        )
    return p, found[-1]
