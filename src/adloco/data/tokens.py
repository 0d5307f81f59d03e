"""Tokenize once, cache on disk, pack into blocks of ``seq_len`` (EOS between documents, no padding).

Cache layout (content-addressed, written atomically, read memory-mapped, never unpickled):
``<cache>/tokenizers/<key>/tokenizer.json`` and ``<cache>/tokens/<key>/{train,val}.npy``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from adloco.config import DataConfig
from adloco.data.corpus import Document, fingerprint, load_documents, split
from adloco.errors import UserError

EOS = "<|endoftext|>"
CACHE_VERSION = "1"


def cache_root(configured: str | None) -> Path:
    if configured:
        return Path(configured).expanduser()
    env = os.environ.get("ADLOCO_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "adloco"


def _atomic_dir(final: Path, fill) -> None:  # type: ignore[no-untyped-def]
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
            if not final.exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _train_bpe(docs: list[Document], vocab_size: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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
    return tok


def _wrap(tok, seq_len: int):  # type: ignore[no-untyped-def]
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, model_max_length=seq_len
    )


def _encode(docs: list[Document], tok, eos_id: int, dtype) -> np.ndarray:  # type: ignore[no-untyped-def]
    parts: list[np.ndarray] = []
    for i in range(0, len(docs), 256):
        for enc in tok.encode_batch([d.text for d in docs[i : i + 256]], add_special_tokens=False):
            parts.append(np.asarray(enc.ids, dtype=dtype))
            parts.append(np.asarray([eos_id], dtype=dtype))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


@dataclass
class TokenData:
    """Train and validation token streams plus the tokenizer that made them."""

    train: np.ndarray  # (n_train_tokens,) memory-mapped
    val: np.ndarray  # (n_val_tokens,) memory-mapped
    tokenizer: object  # a transformers PreTrainedTokenizerFast
    vocab_size: int
    eos_id: int
    seq_len: int
    n_documents: tuple[int, int]  # (train, validation)

    @property
    def n_train_blocks(self) -> int:
        return len(self.train) // self.seq_len

    @property
    def n_val_blocks(self) -> int:
        return len(self.val) // self.seq_len

    def train_blocks(self, indices: np.ndarray) -> torch.Tensor:
        """Blocks ``indices`` of the train stream as a (B, T) int64 tensor."""
        return _gather(self.train, indices, self.seq_len)

    def val_blocks(self, start: int, stop: int) -> torch.Tensor:
        """Validation blocks start..stop-1 as a (B, T) int64 tensor."""
        return _gather(self.val, np.arange(start, stop), self.seq_len)


def _gather(tokens: np.ndarray, indices: np.ndarray, seq_len: int) -> torch.Tensor:
    idx = np.asarray(indices, dtype=np.int64)[:, None] * seq_len + np.arange(seq_len)  # (B, T)
    return torch.from_numpy(tokens[idx].astype(np.int64))


def prepare(cfg: DataConfig, log=print) -> TokenData:  # type: ignore[no-untyped-def]
    """Read, split, tokenize (cached) and check that both splits hold at least one block."""
    from tokenizers import Tokenizer

    docs = load_documents(cfg.source, cfg.max_examples)
    train_docs, val_docs = split(docs, cfg.val_fraction)
    vocab_size = int(cfg.tokenizer.split(":", 1)[1])
    root = cache_root(cfg.cache_dir)

    train_fp = fingerprint(train_docs)
    tok_dir = root / "tokenizers" / f"bpe{vocab_size}-{train_fp[:24]}-v{CACHE_VERSION}"
    if not (tok_dir / "tokenizer.json").is_file():
        log(f"training a byte-level BPE tokenizer ({vocab_size} tokens) on {len(train_docs)} documents")
        tok = _train_bpe(train_docs, vocab_size)
        _atomic_dir(tok_dir, lambda d: tok.save(str(d / "tokenizer.json")))
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    eos_id = tok.token_to_id(EOS)
    if eos_id is None:
        raise UserError(f"tokenizer {str(tok_dir)!r}: has no {EOS} token; delete it to retrain")
    actual_vocab = tok.get_vocab_size()
    dtype = np.uint16 if actual_vocab <= np.iinfo(np.uint16).max else np.uint32

    key = f"{tok_dir.name}-{fingerprint(val_docs)[:16]}"
    tokens_dir = root / "tokens" / key
    if not (tokens_dir / "meta.json").is_file():
        log(f"tokenizing {len(docs)} documents (cached for later runs)")

        def fill(d: Path) -> None:
            np.save(d / "train.npy", _encode(train_docs, tok, eos_id, dtype))
            np.save(d / "val.npy", _encode(val_docs, tok, eos_id, dtype))
            (d / "meta.json").write_text(json.dumps({"tokenizer": tok_dir.name, "vocab_size": actual_vocab}))

        _atomic_dir(tokens_dir, fill)
    train = np.load(tokens_dir / "train.npy", mmap_mode="r", allow_pickle=False)
    val = np.load(tokens_dir / "val.npy", mmap_mode="r", allow_pickle=False)
    data = TokenData(
        train,
        val,
        _wrap(tok, cfg.seq_len),
        actual_vocab,
        eos_id,
        cfg.seq_len,
        (len(train_docs), len(val_docs)),
    )
    if data.n_train_blocks < 1:
        raise UserError(
            f"data: the train split holds {len(train)} tokens, fewer than one block of data.seq_len = {cfg.seq_len}"
        )
    if data.n_val_blocks < 1:
        raise UserError(
            f"data: the validation split holds {len(val)} tokens, fewer than one block of data.seq_len = "
            f"{cfg.seq_len}; raise data.val_fraction or lower data.seq_len"
        )
    return data
