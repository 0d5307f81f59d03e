"""Documents: the embedded default (this Python's standard library source) or local text files.

A document is (name, text). The train/validation split is by document, deterministic: a document is held
out when the hash of its name falls below ``val_fraction``, so adding a file never moves another one.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from adloco.errors import UserError

TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".text"}


@dataclass(frozen=True)
class Document:
    name: str
    text: str


def _unit_hash(name: str) -> float:
    """A name's position in [0, 1), stable across runs, machines and Python versions."""
    return int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:12], 16) / float(1 << 48)


def _stdlib_files() -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")
        )
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return root, files


def _local_files(source: str) -> tuple[Path, list[Path]]:
    path = Path(source).expanduser()
    if not path.exists():
        raise UserError(f"data.source = {source!r}: no such file or folder (or use 'stdlib')")
    if path.is_file():
        return path.parent, [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise UserError(
            f"data.source = {source!r}: the folder holds no text files ({', '.join(sorted(TEXT_SUFFIXES))})"
        )
    return path, files


def load_documents(source: str, max_examples: int | None = None) -> list[Document]:
    """Read the documents of ``source``, sorted by name; with ``max_examples``, a fixed sample of them."""
    root, files = _stdlib_files() if source == "stdlib" else _local_files(source)
    if max_examples is not None and len(files) > max_examples:
        # A fixed pseudo-random sample (salted, so it is independent of the validation split).
        files = sorted(files, key=lambda p: _unit_hash("sample:" + p.relative_to(root).as_posix()))
        files = files[:max_examples]
        files.sort()
    docs = []
    for p in files:
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UserError(f"data file {str(p)!r}: cannot be read ({exc.strerror})") from None
        if text.strip():
            docs.append(Document(p.relative_to(root).as_posix(), text))
    if not docs:
        raise UserError(f"data.source = {source!r}: every document is empty")
    return docs


def split(docs: list[Document], val_fraction: float) -> tuple[list[Document], list[Document]]:
    """(train, validation) by a hash of each document's name; both non-empty when possible."""
    if len(docs) < 2:
        raise UserError(f"data: {len(docs)} document: at least 2 are needed to hold one out for validation")
    ranked = sorted(docs, key=lambda d: _unit_hash(d.name))
    n_val = sum(1 for d in docs if _unit_hash(d.name) < val_fraction)
    n_val = min(max(n_val, 1), len(docs) - 1)
    val = sorted(ranked[:n_val], key=lambda d: d.name)
    train = sorted(ranked[n_val:], key=lambda d: d.name)
    return train, val


def fingerprint(docs: list[Document]) -> str:
    """Content hash of a list of documents (names and texts)."""
    h = hashlib.sha256()
    for d in docs:
        h.update(d.name.encode("utf-8"))
        h.update(b"\0")
        h.update(d.text.encode("utf-8", errors="replace"))
        h.update(b"\1")
    return h.hexdigest()
