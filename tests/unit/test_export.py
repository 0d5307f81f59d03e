"""The final model's folder (adloco.models.export): what save_pretrained writes, a file at a time.

A model larger than ``logging.model_file_mb`` is written as numbered files with an index that
``from_pretrained`` reads; tied weights are written once; the folder appears whole or not at all; a rank
without a path writes nothing. The sharded case (every rank gathering a parameter at a time) runs in
tests/integration/test_shards.py, whose saved model is the unsharded run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from adloco.models import export
from tests.helpers import only_run, run_main
from tests.toy_lm import tiny_llama

TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json"}


class _Tokenizer:
    """Stands in for a tokenizer: what save_pretrained of one leaves."""

    def save_pretrained(self, path: Path) -> None:
        for name in TOKENIZER_FILES:
            (Path(path) / name).write_text("{}\n")


@pytest.mark.parametrize("tie", [False, True])
def test_a_model_over_the_file_size_is_numbered_files_with_an_index(tmp_path: Path, tie: bool) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = tiny_llama(tie)
    export.save(model, _Tokenizer(), tmp_path / "model", max_file_bytes=4096)
    files = sorted(p.name for p in (tmp_path / "model").iterdir())
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert {"config.json", "generation_config.json", export.INDEX, *TOKENIZER_FILES} <= set(files)
    index = json.loads((tmp_path / "model" / export.INDEX).read_text())
    assert set(index["weight_map"].values()) == set(shards)
    written = {k: v for s in shards for k, v in load_file(tmp_path / "model" / s).items()}
    assert set(written) == set(index["weight_map"])
    assert ("lm_head.weight" in written) is not tie  # a tied weight once, under the name loading expects
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert loaded.config.tie_word_embeddings is tie
    for (n, p), (m, q) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert n == m and torch.equal(p, q), n
    assert not (tmp_path / "model.partial").exists()


def test_a_small_model_is_one_file_and_a_rank_without_a_path_writes_nothing(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = tiny_llama()
    export.save(model, _Tokenizer(), None, max_file_bytes=4096)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "model.partial").mkdir()  # what a save cut short left: replaced, not merged
    (tmp_path / "model.partial" / "stale.safetensors").write_bytes(b"x")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "old.txt").write_text("an earlier model\n")
    export.save(model, _Tokenizer(), tmp_path / "model", max_file_bytes=2**30)
    names = {p.name for p in (tmp_path / "model").iterdir()}
    assert names == {"model.safetensors", "config.json", "generation_config.json", *TOKENIZER_FILES}
    got = load_file(tmp_path / "model" / "model.safetensors")
    assert all(torch.equal(got[k], v) for k, v in model.state_dict().items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_run_writes_its_model_in_files_of_model_file_mb(tmp_path: Path, text_corpus: Path) -> None:
    """llama-tiny's float32 at 1 MiB a file: several files, loaded whole by from_pretrained."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "runs"
    sets = {
        "model.name": "llama-tiny",
        "data.source": str(text_corpus),
        "data.seq_len": 16,
        "algorithm.method": "diloco",
        "algorithm.workers": 1,
        "algorithm.rounds": 1,
        "algorithm.inner_steps": 1,
        "batch.initial": 1,
        "eval.max_examples": 2,
        "logging.out_dir": str(out),
        "logging.plots": "false",
        "logging.model_file_mb": 1,
    }
    p = run_main("train", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")])
    assert p.returncode == 0, p.stderr
    model = only_run(out) / "model"
    shards = sorted(model.glob("model-*.safetensors"))
    assert len(shards) >= 3
    index = json.loads((model / export.INDEX).read_text())
    for s in shards:  # at most 1 MiB of tensors, or a single tensor larger than that (the embedding)
        held = [k for k, f in index["weight_map"].items() if f == s.name]
        assert s.stat().st_size <= 2**20 + 2**14 or len(held) == 1, (s.name, held)
    loaded = AutoModelForCausalLM.from_pretrained(model)
    assert sum(p.numel() for p in loaded.parameters()) == index["metadata"]["total_parameters"]
