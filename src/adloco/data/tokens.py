"""Tokenize once, cache on disk, serve batches.

Cache layout, content-addressed by (source identity, tokenizer, task, and for classification the
sequence length), written atomically, read memory-mapped, never unpickled:
``<cache>/data/<key>/{meta.json, tokenizer/, *.npy}``. The tokenizer is saved there too, so a cached run
needs neither the source nor the hub.

Language modelling: documents are packed into one token stream with an end-of-text token after each;
an example is a block of ``seq_len`` tokens (no padding), its labels the same tokens (the model shifts
them). Blocks are views of the stream, so one cache serves every ``seq_len``.
Classification: each document is cut to ``seq_len`` tokens (with the tokenizer's special tokens) and
padded per batch to the longest row.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adloco.config import DataConfig
from adloco.data.sources import Document, Source, make_source
from adloco.errors import UserError
from adloco.models import hub

EOS = "<|endoftext|>"
CACHE_VERSION = "2"
TOKENIZER_HINT = "use 'bpe:<vocab size>' or a local tokenizer folder"
# Files one of which a saved tokenizer holds (fast, slow BPE, WordPiece, SentencePiece).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def cache_root(configured: str | None) -> Path:
    if configured:
        return Path(configured).expanduser()
    env = os.environ.get("ADLOCO_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "adloco"


def _atomic_dir(final: Path, fill: Callable[[Path], None]) -> None:
    """Create ``final`` by filling a temporary sibling and renaming it (a concurrent writer may win)."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    except OSError as exc:
        raise UserError(
            f"cache folder {str(final.parent)!r}: cannot be written ({exc.strerror}); set data.cache_dir "
            "or $ADLOCO_CACHE to a writable folder"
        ) from None
    try:
        fill(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "meta.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _one_builder(folder: Path, log: Callable[[str], None]) -> Iterator[None]:
    """Hold the lock of the cache entry ``folder`` while one process builds it: runs that start together on
    one machine (a bench's jobs, a test session's workers) tokenize a corpus once, the others wait and read
    it. Where the lock cannot be taken (no fcntl, a read-only or lockless file system) the build goes on
    unlocked, as before: :func:`_atomic_dir` keeps concurrent builders safe, only slower."""
    try:
        import fcntl

        folder.parent.mkdir(parents=True, exist_ok=True)
        handle = open(folder.parent / f".{folder.name}.lock", "a+")  # noqa: SIM115 - held across the yield
    except (ImportError, OSError):
        yield
        return
    with handle:
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(f"waiting for another process that is building the same cache entry ({folder})")
                fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------


def _tokenizer_identity(spec: str) -> str:
    if spec.startswith("bpe:"):
        return spec
    path = Path(spec).expanduser()
    if path.exists():
        h = hashlib.sha256(str(path.resolve()).encode())
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            st = f.stat()
            h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        return "path:" + h.hexdigest()
    return "hub:" + spec


def _train_bpe(docs: list[Document], vocab_size: int, seq_len: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((d.text for d in docs), trainer, length=len(docs))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS, model_max_length=seq_len
    )


def load_pretrained_tokenizer(spec: str, trust_remote_code: bool) -> Any:
    """A tokenizer by local path or hub name (AutoTokenizer), or one clear line why not."""
    from transformers import AutoTokenizer

    path = Path(spec).expanduser()
    if not path.exists():
        if not hub.looks_like_hub_name(spec) or spec.startswith((".", "/", "~")):
            raise UserError(f"config: data.tokenizer = {spec!r}: no such folder (or 'bpe:<vocab size>')")
        hub.require("data.tokenizer", spec, TOKENIZER_HINT)
    try:
        return AutoTokenizer.from_pretrained(
            str(path) if path.exists() else spec, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds; one line for all
        if not path.exists() and hub.offline():
            raise hub.offline_error("data.tokenizer", spec, TOKENIZER_HINT) from None
        if path.is_dir() and not any((path / f).is_file() for f in TOKENIZER_FILES):
            raise UserError(
                f"config: data.tokenizer = {spec!r}: the folder holds no tokenizer ({', '.join(TOKENIZER_FILES[:2])}, "
                "...); a checkpoint saved without one needs data.tokenizer set to the tokenizer it was trained "
                "with"
            ) from None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"config: data.tokenizer = {spec!r}: cannot be loaded ({first})") from None


def _encode(
    tokenizer: Any, texts: list[str], special: bool, max_length: int | None = None
) -> list[list[int]]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not special:  # the Rust tokenizer directly: same ids, less overhead
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    enc = tokenizer(
        texts,
        add_special_tokens=special,
        truncation=max_length is not None,
        max_length=max_length,
        verbose=False,
    )
    return list(enc["input_ids"])


# --------------------------------------------------------------------------------------------------
# Data sets
# --------------------------------------------------------------------------------------------------


class LMData:
    """Packed token streams; an example is a block of ``seq_len`` tokens."""

    task = "causal_lm"

    def __init__(
        self, train: np.ndarray, val: np.ndarray, tokenizer: Any, seq_len: int, meta: dict[str, Any]
    ):
        self.train, self.val, self.tokenizer, self.seq_len = train, val, tokenizer, seq_len
        self.eos_id: int = meta["eos_id"]
        self.pad_id: int = meta["pad_id"]
        self.vocab_size: int = meta["vocab_size"]
        self.max_token_id: int = meta["max_token_id"]
        self.n_documents = tuple(meta["documents"])
        self.num_labels = 0

    @property
    def n_train(self) -> int:
        return len(self.train) // self.seq_len

    @property
    def n_val(self) -> int:
        return len(self.val) // self.seq_len

    def _blocks(self, tokens: np.ndarray, indices: np.ndarray) -> dict[str, torch.Tensor]:
        idx = np.asarray(indices, dtype=np.int64)[:, None] * self.seq_len + np.arange(self.seq_len)  # (B, T)
        x = torch.from_numpy(tokens[idx].astype(np.int64))
        return {"input_ids": x, "labels": x}  # labels are the inputs: the model shifts them

    def train_batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        return self._blocks(self.train, indices)

    def val_batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        return self._blocks(self.val, indices)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.train, self.val)


class ClassificationData:
    """Documents cut to ``seq_len`` tokens, with labels; batches padded to their longest row."""

    task = "classification"

    def __init__(self, arrays: dict[str, np.ndarray], tokenizer: Any, seq_len: int, meta: dict[str, Any]):
        self.a, self.tokenizer, self.seq_len = arrays, tokenizer, seq_len
        self.pad_id: int = meta["pad_id"]
        self.eos_id: int = meta["eos_id"]
        self.vocab_size: int = meta["vocab_size"]
        self.max_token_id: int = meta["max_token_id"]
        self.label_names: list[str] = meta["label_names"]
        self.num_labels = len(self.label_names)
        self.n_documents = tuple(meta["documents"])

    @property
    def n_train(self) -> int:
        return len(self.a["train_labels"])

    @property
    def n_val(self) -> int:
        return len(self.a["val_labels"])

    def _rows(self, split: str, indices: np.ndarray) -> dict[str, torch.Tensor]:
        idx = np.asarray(indices, dtype=np.int64)
        lens = self.a[f"{split}_lens"][idx]
        width = int(lens.max()) if len(idx) else 1
        ids = torch.from_numpy(self.a[f"{split}_ids"][idx, :width].astype(np.int64))  # (B, L)
        mask = (torch.arange(width)[None, :] < torch.from_numpy(lens.astype(np.int64))[:, None]).long()
        labels = torch.from_numpy(self.a[f"{split}_labels"][idx].astype(np.int64))
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def train_batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        return self._rows("train", indices)

    def val_batch(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        return self._rows("val", indices)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(self.a[k] for k in sorted(self.a))


Data = LMData | ClassificationData


def _special_ids(tokenizer: Any, task: str, spec: str) -> tuple[int, int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        eos = tokenizer.sep_token_id
    if eos is None and task == "causal_lm":
        raise UserError(
            f"config: data.tokenizer = {spec!r}: has no end-of-text (or separator) token to put between packed "
            "documents"
        )
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = eos if eos is not None else 0
    return int(eos if eos is not None else pad), int(pad)


def _label_ids(docs: list[Document], names: list[str] | None) -> tuple[np.ndarray, list[str]]:
    labels = [d.label for d in docs]
    if names is None:
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in labels):
            names = [str(i) for i in range(int(max(labels)) + 1)]
        else:
            names = sorted({str(x) for x in labels})
    index = {n: i for i, n in enumerate(names)}
    out = []
    for d in docs:
        key = str(d.label)
        if key not in index:
            raise UserError(f"data: label {d.label!r} of {d.name!r} is not among the training labels {names}")
        out.append(index[key])
    return np.asarray(out, dtype=np.int64), names


def prepare(
    cfg: DataConfig,
    task: str = "causal_lm",
    trust_remote_code: bool = False,
    log: Callable[[str], None] = print,
) -> Data:
    """Read, split and tokenize (cached), and check that both splits hold at least one example."""
    source = make_source(cfg)
    key_parts = [
        CACHE_VERSION,
        task,
        source.identity(),
        _tokenizer_identity(cfg.tokenizer),
        f"{cfg.val_fraction}",
        f"{cfg.max_examples}",
        cfg.text_field,
    ]
    if task == "classification":
        key_parts += [cfg.label_field, str(cfg.seq_len)]
    key = hashlib.sha256("\n".join(key_parts).encode()).hexdigest()[:32]
    folder = cache_root(cfg.cache_dir) / "data" / key
    if not (folder / "meta.json").is_file():
        with _one_builder(folder, log):
            # another process may have built it while this one waited for the lock
            if not (folder / "meta.json").is_file():
                _build(folder, cfg, task, source, trust_remote_code, log)
    data = _open_cached(folder, cfg, task, trust_remote_code)
    if task == "causal_lm" and data.n_train < 1:
        assert isinstance(data, LMData)
        raise UserError(
            f"data: the train split holds {len(data.train)} tokens, fewer than one block of "
            f"data.seq_len = {cfg.seq_len}"
        )
    unit = f"blocks of data.seq_len = {cfg.seq_len} tokens" if task == "causal_lm" else "examples"
    if data.n_val < 1:
        raise UserError(
            f"data: the validation split holds no {unit}; raise data.val_fraction"
            + (" or lower data.seq_len" if task == "causal_lm" else " or set data.val_split")
        )
    return data


def _build(
    folder: Path,
    cfg: DataConfig,
    task: str,
    source: Source,
    trust_remote_code: bool,
    log: Callable[[str], None],
) -> None:
    """Read, split, train or load the tokenizer, tokenize, and write ``folder`` (atomically)."""
    pretrained = not cfg.tokenizer.startswith("bpe:")
    if pretrained:  # before the data is read: a tokenizer that does not load fails at once
        tokenizer = load_pretrained_tokenizer(cfg.tokenizer, trust_remote_code)
    log(f"reading {source.description}")
    train_docs, val_docs = source.load(cfg, need_label=task == "classification")
    if not pretrained:
        asked = int(cfg.tokenizer[4:])
        log(f"training a byte-level BPE tokenizer (up to {asked} tokens) on {len(train_docs)} documents")
        tokenizer = _train_bpe(train_docs, asked, cfg.seq_len)
        got = len(tokenizer)
        short = (
            f", fewer than the {asked} asked: the corpus is too small for more merges" if got < asked else ""
        )
        log(f"tokenizer: a vocabulary of {got} tokens{short}")
    eos, pad = _special_ids(tokenizer, task, cfg.tokenizer)
    log(f"tokenizing {len(train_docs) + len(val_docs)} documents (cached for later runs)")

    def fill(d: Path) -> None:
        meta: dict[str, Any] = {
            "task": task,
            "eos_id": eos,
            "pad_id": pad,
            "vocab_size": len(tokenizer),
            "documents": [len(train_docs), len(val_docs)],
            "source": source.description,
        }
        dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.uint32
        top = 0
        if task == "causal_lm":
            for name, docs in (("train", train_docs), ("val", val_docs)):
                parts: list[np.ndarray] = []
                for i in range(0, len(docs), 256):
                    for ids in _encode(tokenizer, [x.text for x in docs[i : i + 256]], special=False):
                        parts.append(np.asarray([*ids, eos], dtype=dtype))
                arr = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
                top = max(top, int(arr.max()) if len(arr) else 0)
                np.save(d / f"{name}.npy", arr)
        else:
            names: list[str] | None = None
            for name, docs in (("train", train_docs), ("val", val_docs)):
                mat = np.full((len(docs), cfg.seq_len), pad, dtype=np.int32)
                lens = np.zeros(len(docs), dtype=np.int32)
                for i in range(0, len(docs), 256):
                    enc = _encode(
                        tokenizer,
                        [x.text for x in docs[i : i + 256]],
                        special=True,
                        max_length=cfg.seq_len,
                    )
                    for j, row in enumerate(enc):
                        mat[i + j, : len(row)] = row
                        lens[i + j] = max(1, len(row))
                labels, names = _label_ids(docs, names)
                top = max(top, int(mat.max()) if mat.size else 0)
                np.save(d / f"{name}_ids.npy", mat)
                np.save(d / f"{name}_lens.npy", lens)
                np.save(d / f"{name}_labels.npy", labels)
            meta["label_names"] = names
        meta["max_token_id"] = top
        tokenizer.save_pretrained(d / "tokenizer")
        (d / "meta.json").write_text(json.dumps(meta))

    _atomic_dir(folder, fill)


def _open_cached(folder: Path, cfg: DataConfig, task: str, trust_remote_code: bool) -> Data:
    """The cached data set in ``folder``; a damaged one (edited, truncated, half-deleted) is one line
    naming the folder, never a reader's traceback."""
    from transformers import AutoTokenizer

    def load(name: str) -> np.ndarray:
        return np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)

    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        tokenizer = AutoTokenizer.from_pretrained(
            str(folder / "tokenizer"), trust_remote_code=trust_remote_code
        )
        tokenizer.model_max_length = cfg.seq_len
        if task == "causal_lm":
            return LMData(load("train"), load("val"), tokenizer, cfg.seq_len, meta)
        names = [f"{s}_{k}" for s in ("train", "val") for k in ("ids", "lens", "labels")]
        return ClassificationData({n: load(n) for n in names}, tokenizer, cfg.seq_len, meta)
    except Exception as exc:  # noqa: BLE001 - json, numpy and transformers raise many kinds; one line for all
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(
            f"cache folder {str(folder)!r}: damaged ({type(exc).__name__}: {first}); delete it and run again "
            "(it is rebuilt from data.source)"
        ) from None
