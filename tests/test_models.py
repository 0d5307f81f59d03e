"""Models: presets, checkpoints loaded by path, output-layer re-initialization, fit checks, precision."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from adloco import models
from adloco.algorithms.switch import Plan
from adloco.config import DataConfig, InnerConfig, ModelConfig
from adloco.data.tokens import prepare
from adloco.engine.worker import ProbeSpec, Worker
from adloco.errors import UserError
from tests.helpers import coordinator, synthetic_data, tiny_config

TINY = [
    "--set",
    "data.seq_len=16",
    "--set",
    "data.val_fraction=0.2",
    "--set",
    "algorithm.rounds=2",
    "--set",
    "algorithm.inner_steps=2",
    "--set",
    "merge.every=1",
    "--set",
    "batch.initial=2",
    "--set",
    "switch.b_max=2",
    "--set",
    "eval.max_examples=4",
    "--set",
    "logging.progress=plain",
]


def adloco(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adloco", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, text_corpus: Path) -> Path:
    """A tiny Llama checkpoint and its tokenizer, saved the Hugging Face way into one folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = tmp_path_factory.mktemp("ckpt")
    data = prepare(
        DataConfig(source=str(text_corpus), tokenizer="bpe:300", seq_len=16, cache_dir=str(tmp / "cache")),
        log=lambda s: None,
    )
    cfg = LlamaConfig(
        vocab_size=len(data.tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        eos_token_id=data.eos_id,
        bos_token_id=data.eos_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp / "model")
    data.tokenizer.save_pretrained(tmp / "model")
    return tmp / "model"


def test_checkpoint_by_path_end_to_end(tmp_path: Path, text_corpus: Path, checkpoint: Path) -> None:
    out = tmp_path / "runs"
    p = adloco(
        "train",
        *TINY,
        "--set",
        f"model.name={checkpoint}",
        "--set",
        f"data.tokenizer={checkpoint}",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={out}",
        "--set",
        "model.reinit_output=true",
        "--set",
        "model.init=independent",
    )
    assert p.returncode == 0, p.stderr
    (run,) = list(out.iterdir())
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(run / "model")
    assert loaded.config.hidden_size == 32  # the checkpoint's shape, not a preset's
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_val_ppl"] < summary["initial_val_ppl"]


def test_loaded_weights_are_the_checkpoints(checkpoint: Path) -> None:
    from transformers import AutoModelForCausalLM

    f = models.ModelFactory(ModelConfig(name=str(checkpoint)), 300, 16, 0, 0)
    a = f.build(0)
    ref = AutoModelForCausalLM.from_pretrained(checkpoint)
    for (n, p), (_, q) in zip(a.named_parameters(), ref.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    assert f.build(1) is not a and torch.equal(next(f.build(1).parameters()), next(a.parameters()))


def test_tokenizer_larger_than_the_embedding(tmp_path: Path, text_corpus: Path, checkpoint: Path) -> None:
    p = adloco(
        "train",
        *TINY,
        "--set",
        f"model.name={checkpoint}",
        "--set",
        "data.tokenizer=bpe:400",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    )
    assert p.returncode == 2
    rows = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    assert p.stderr.strip().splitlines() == [
        f"adloco: error: config: data.tokenizer: its vocabulary (400 tokens) is larger than model.name = "
        f"'{checkpoint}''s embedding ({rows} rows); use the model's own tokenizer"
    ]
    assert not (tmp_path / "runs").exists()


def test_seq_len_beyond_the_positions(tmp_path: Path, text_corpus: Path, checkpoint: Path) -> None:
    p = adloco(
        "train",
        *TINY,
        "--set",
        f"model.name={checkpoint}",
        "--set",
        f"data.tokenizer={checkpoint}",
        "--set",
        "data.seq_len=128",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    )
    assert p.returncode == 2
    assert f"data.seq_len = 128: larger than model.name = '{checkpoint}''s maximum positions (64)" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [("model.name", "keeeeenw/MicroLlama"), ("data.tokenizer", "TinyLlama/TinyLlama-1.1B-step-50K-105b")],
)
def test_hub_names_offline_fail_at_once(tmp_path: Path, text_corpus: Path, field: str, value: str) -> None:
    t0 = time.monotonic()
    p = adloco(
        "train",
        *TINY,
        "--set",
        f"{field}={value}",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    )
    assert p.returncode == 2 and time.monotonic() - t0 < 30
    (line,) = p.stderr.strip().splitlines()
    assert (
        line.startswith(f"adloco: error: config: {field} = '{value}': not a local path") and "offline" in line
    )


def test_mixed_precision_needs_cuda(tmp_path: Path, text_corpus: Path) -> None:
    p = adloco(
        "train",
        *TINY,
        "--set",
        "model.precision=bf16",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        "model.name=llama-micro",
        "--set",
        "data.tokenizer=bpe:300",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    )
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "adloco: error: config: model.precision = 'bf16': mixed precision needs CUDA "
        "(this run is on cpu); use fp32"
    )


def test_reinit_output_per_trainer(checkpoint: Path) -> None:
    """On a checkpoint, trainers differ in their output layer only; with init same, not at all."""
    for init, differ in (("independent", True), ("same", False)):
        cfg = tiny_config(
            **{
                "model": {"name": str(checkpoint), "reinit_output": True, "init": init},
                "algorithm": {"trainers": 2, "workers": 2},
            }
        )
        c = coordinator(cfg)
        names = [n for n, _ in c.workers[0].model.named_parameters()]
        views = {}
        for t in (0, 1):
            c.workers[0].load(c.theta(t))
            views[t] = {n: p.detach().clone() for n, p in c.workers[0].model.named_parameters()}
        ref = dict(
            models.ModelFactory(ModelConfig(name=str(checkpoint)), 64, 8, 0, 0).build(0).named_parameters()
        )
        for n in names:
            if "lm_head" in n:
                assert torch.equal(views[0][n], views[1][n]) == (not differ), n
                assert not torch.equal(views[0][n], ref[n])  # redrawn, not the checkpoint's
            else:
                assert torch.equal(views[0][n], views[1][n]) and torch.equal(views[0][n], ref[n]), n


def test_reinit_output_refuses_tied_embeddings() -> None:
    cfg = tiny_config(**{"model": {"reinit_output": True}})  # llama-micro ties its embeddings
    with pytest.raises(UserError, match="ties its output layer to the input embeddings"):
        coordinator(cfg)


def _worker(precision: str, clip: float = 0.0) -> Worker:
    model = models.ModelFactory(ModelConfig(name="llama-micro"), 64, 8, 0, 0).build(3)
    return Worker(0, model, InnerConfig(clip=clip, lr=1e-3), b_max=4, precision=precision)


class Stream:
    def __init__(self) -> None:
        self.pos = 0

    def take(self, k: int) -> np.ndarray:
        self.pos += k
        return np.arange(self.pos - k, self.pos)


def test_fp16_loss_scaling_skips_overflow_and_unscales_statistics() -> None:
    data = synthetic_data()
    w32, w16 = _worker("fp32"), _worker("fp16")
    probe = ProbeSpec(4, 2, False, "sum")
    r32 = w32.run_round(
        Stream(), data.train_batch, Plan(8, 1, False), 1, lambda h: 1e-3, probe, torch.zeros(w32.flat.numel)
    )
    r16 = w16.run_round(
        Stream(), data.train_batch, Plan(8, 1, False), 1, lambda h: 1e-3, probe, torch.zeros(w16.flat.numel)
    )
    assert r16.skipped == 0
    # statistics come back in true units, not multiplied by the 2^16 loss scale
    assert r16.stats.sum_sq == pytest.approx(r32.stats.sum_sq, rel=5e-2)
    torch.testing.assert_close(w16.sample_sum, w32.sample_sum, rtol=5e-2, atol=1e-4)
    # an overflow: the step is skipped, the scale halves, the parameters do not move
    before = w16.flat.param.clone()
    w16.loss_scale = 1e38
    r = w16.run_round(
        Stream(), data.train_batch, Plan(8, 1, False), 1, lambda h: 1e-3, None, torch.zeros(w16.flat.numel)
    )
    assert r.skipped == 1 and w16.loss_scale == 5e37 and torch.equal(w16.flat.param, before)


def test_bf16_autocast_runs_and_needs_no_scaling() -> None:
    w = _worker("bf16")
    assert w.loss_scale == 1.0
    r = w.run_round(
        Stream(),
        synthetic_data().train_batch,
        Plan(4, 1, False),
        2,
        lambda h: 1e-3,
        None,
        torch.zeros(w.flat.numel),
    )
    assert r.finite and r.skipped == 0


def test_language_model_presets_learn_every_token() -> None:
    """No padding_idx in a causal LM: the end-of-text token (id 0 here) must get gradient and start random."""
    model = models.ModelFactory(ModelConfig(name="llama-micro"), 64, 8, 0, 0).build(0)
    emb = model.get_input_embeddings()
    assert emb.padding_idx is None and emb.weight[0].abs().sum() > 0
    x = torch.zeros(1, 8, dtype=torch.long)
    model(input_ids=x, labels=x).loss.backward()
    assert emb.weight.grad[0].abs().sum() > 0
