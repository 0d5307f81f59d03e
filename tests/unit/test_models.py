"""Models: presets, checkpoints loaded by path, output-layer re-initialization, fit checks, precision."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from adloco import models
from adloco.config import InnerConfig, ModelConfig
from adloco.engine.inner import make_optimizer
from adloco.errors import UserError
from adloco.library.flat import flatten
from adloco.library.replica import Probe, Replica
from tests.helpers import TINY_RUN, driver, run_main, set_args, synthetic_data, tiny_checkpoint, tiny_config

# TINY_RUN for 2 rounds on the model and tokenizer each test names (a checkpoint's own tokenizer when unset)
TINY = set_args(
    {k: v for k, v in TINY_RUN.items() if k not in ("model.name", "data.tokenizer")},
    algorithm__rounds="2",
    logging__progress="plain",
)


adloco = run_main  # the command, in this process


def never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """At once, measured without a clock: no sleep on the way (a retry's back-off, a timeout's wait)."""

    def sleep(seconds: float) -> None:
        raise AssertionError(f"slept {seconds} s: offline, the hub must be refused at once")

    monkeypatch.setattr(time, "sleep", sleep)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, text_corpus: Path) -> Path:
    """A tiny Llama checkpoint and its tokenizer, saved the Hugging Face way into one folder."""
    tmp = tmp_path_factory.mktemp("ckpt")
    return tiny_checkpoint(tmp / "model", text_corpus, hidden=32, cache_dir=tmp / "cache")


def test_checkpoint_by_path_end_to_end(tmp_path: Path, text_corpus: Path, checkpoint: Path) -> None:
    """data.tokenizer left unset: the checkpoint's own tokenizer, not one trained anew."""
    out = tmp_path / "runs"
    p = adloco(
        "train",
        *TINY,
        "--set",
        f"model.name={checkpoint}",
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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(run / "model")
    assert loaded.config.hidden_size == 32  # the checkpoint's shape, not a preset's
    assert f"tokenizer: {checkpoint}\n" in (run / "config.yaml").read_text()
    own, saved = AutoTokenizer.from_pretrained(checkpoint), AutoTokenizer.from_pretrained(run / "model")
    text = "def f(x):\n    return x + 1\n"
    assert own(text).input_ids == saved(text).input_ids and len(saved) == loaded.config.vocab_size == 300
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


def test_the_tokenizer_follows_a_checkpoint_unless_set(tmp_path: Path, checkpoint: Path) -> None:
    from adloco.config import resolve

    assert resolve(None, [f"model.name={checkpoint}"]).data.tokenizer == str(checkpoint)
    assert resolve(None, ["model.name=org/model"]).data.tokenizer == "org/model"
    assert resolve(None, ["model.name=llama-micro"]).data.tokenizer == "bpe:4096"  # a preset: trained anew
    f = tmp_path / "c.yaml"
    f.write_text(f"model:\n  name: {checkpoint}\ndata:\n  tokenizer: bpe:300\n")
    assert resolve(f).data.tokenizer == "bpe:300"  # set explicitly: kept (and checked once loaded)
    explicit = resolve(None, [f"model.name={checkpoint}", "data.tokenizer=other/tokenizer"])
    assert explicit.data.tokenizer == "other/tokenizer"


def test_a_padded_embedding_takes_its_own_smaller_tokenizer_only(tmp_path: Path, checkpoint: Path) -> None:
    """Embeddings are often padded past the tokenizer: the checkpoint's own tokenizer may be smaller than
    the embedding; a foreign one must match it."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    padded = tmp_path / "padded"
    shape = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    LlamaForCausalLM(LlamaConfig(vocab_size=320, intermediate_size=32, **shape)).save_pretrained(padded)
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(padded)  # 300 tokens, 320 rows
    models.ModelFactory(ModelConfig(name=str(padded)), 300, 16, 0, 0)
    with pytest.raises(UserError, match=r"its vocabulary \(260 tokens\) does not match .* \(320 rows\)"):
        models.ModelFactory(ModelConfig(name=str(padded)), 260, 16, 0, 0)
    with pytest.raises(UserError, match=r"its vocabulary \(64 tokens\) does not match .* \(300 rows\)"):
        models.ModelFactory(ModelConfig(name=str(checkpoint)), 64, 16, 0, 0)


def test_a_checkpoint_without_a_tokenizer_says_so(tmp_path: Path, text_corpus: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    bare = tmp_path / "bare"
    shape = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    LlamaForCausalLM(LlamaConfig(vocab_size=300, intermediate_size=32, **shape)).save_pretrained(bare)
    p = adloco(
        "train",
        *TINY,
        "--set",
        f"model.name={bare}",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    )
    assert p.returncode == 2 and not (tmp_path / "runs").exists()
    assert p.stderr.strip().splitlines() == [
        f"adloco: error: config: data.tokenizer = '{bare}': the folder holds no tokenizer (tokenizer.json, "
        "tokenizer_config.json, ...); a checkpoint saved without one needs data.tokenizer set to the tokenizer "
        "it was trained with"
    ]


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
        f"adloco: error: config: data.tokenizer: its vocabulary (400 tokens) does not match model.name = "
        f"'{checkpoint}''s embedding ({rows} rows); use the model's own tokenizer (leave data.tokenizer unset)"
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
    ("sets", "field", "value"),
    [
        (["model.name=keeeeenw/MicroLlama", "data.tokenizer=bpe:300"], "model.name", "keeeeenw/MicroLlama"),
        (["model.name=keeeeenw/MicroLlama"], "data.tokenizer", "keeeeenw/MicroLlama"),  # the model's own
        (
            ["data.tokenizer=TinyLlama/TinyLlama-1.1B-step-50K-105b"],
            "data.tokenizer",
            "TinyLlama/TinyLlama-1.1B-step-50K-105b",
        ),
    ],
)
def test_hub_names_offline_fail_at_once(
    tmp_path: Path,
    text_corpus: Path,
    sets: list[str],
    field: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    never_waits(monkeypatch)
    p = adloco(
        "train",
        *TINY,
        *[a for s in sets for a in ("--set", s)],
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    )
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert (
        line.startswith(f"adloco: error: config: {field} = '{value}': not a local path") and "offline" in line
    )


def test_mixed_precision_needs_cuda(
    tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine without CUDA (made one here: on a GPU the same run is legal) bf16 is refused before
    anything is built."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
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
    assert not (tmp_path / "runs").exists()


def test_what_a_run_asks_of_the_machine_is_checked_once_where_it_trains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """check_placement judges the config against this machine and launch, not resolve(): a config for a
    GPU is still printed and read back on a machine without one. CUDA is mocked both ways."""
    from adloco.config import resolve
    from adloco.config.checks import check_placement

    gpu = resolve(None, ["model.precision=bf16", "runtime.device=cuda"])  # resolves without a GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_placement(gpu, None)  # legal where there is CUDA
    check_placement(resolve(None, ["model.precision=fp16"]), None)  # auto picks CUDA there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="runtime.device = 'cuda': no CUDA device is available"):
        check_placement(gpu, None)
    with pytest.raises(UserError, match="model.precision = 'fp16': mixed precision needs CUDA"):
        check_placement(resolve(None, ["model.precision=fp16"]), None)
    # the layout of workers over the processes torchrun started; flexible (resume, elastic): any number
    four = resolve(None, ["algorithm.workers=4", "runtime.shards=2"])
    with pytest.raises(
        UserError, match=r"algorithm.workers = 4: must equal processes \(4\) / runtime.shards"
    ):
        check_placement(four, 4)
    check_placement(four, 8)
    check_placement(four, 4, flexible=True)
    with pytest.raises(UserError, match="runtime.shards = 2: a sharded worker is several processes"):
        check_placement(four, None)


def test_reinit_output_per_trainer(checkpoint: Path) -> None:
    """On a checkpoint, trainers differ in their output layer only; with init same, not at all."""
    for init, differ in (("independent", True), ("same", False)):
        cfg = tiny_config(
            **{
                "model": {"name": str(checkpoint), "reinit_output": True, "init": init},
                "algorithm": {"trainers": 2, "workers": 2},
            }
        )
        data = synthetic_data(seq_len=8)
        data.vocab_size = 300  # the checkpoint's tokenizer (its ids: the synthetic ones, all < 64)
        c = driver(cfg, data)
        names = [n for n, _ in c.algo.replicas[0].model.named_parameters()]
        views = {}
        for t in (0, 1):
            c.algo.replicas[0].load(c.algo.theta(t))
            views[t] = {n: p.detach().clone() for n, p in c.algo.replicas[0].model.named_parameters()}
        ref = dict(
            models.ModelFactory(ModelConfig(name=str(checkpoint)), 300, 8, 0, 0).build(0).named_parameters()
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
        driver(cfg)


def _worker(precision: str, clip: float = 0.0) -> Replica:
    model = models.ModelFactory(ModelConfig(name="llama-micro"), 64, 8, 0, 0).build(3)
    opt = make_optimizer(flatten(model), InnerConfig(clip=clip, lr=1e-3))
    return Replica(model, opt, clip=clip, b_max=4, precision=precision)


def _step(rep: Replica, batch, probe: Probe | None = None):  # type: ignore[no-untyped-def]
    """One inner step on ``batch``: (loss, statistics, skipped steps)."""
    before = rep.skipped
    loss, stats = rep.gradient(batch, 8, 8, probe, torch.zeros(rep.flat.numel))
    rep.optimizer_step()
    return loss, stats, rep.skipped - before


def test_fp16_loss_scaling_skips_overflow_and_unscales_statistics() -> None:
    data = synthetic_data()
    w32, w16 = _worker("fp32"), _worker("fp16")
    probe = Probe(4, 2, False, "sum")
    batch = data.train_batch(np.arange(8))
    _, s32, _ = _step(w32, batch, probe)
    _, s16, skipped = _step(w16, batch, probe)
    assert skipped == 0
    # statistics come back in true units, not multiplied by the 2^16 loss scale
    assert s16.sum_sq == pytest.approx(s32.sum_sq, rel=5e-2)
    torch.testing.assert_close(w16.sample_sum, w32.sample_sum, rtol=5e-2, atol=1e-4)
    # an overflow: the step is skipped, the scale halves, the parameters do not move
    before = w16.flat.param.clone()
    w16.loss_scale = 1e38
    _, _, skipped = _step(w16, data.train_batch(np.arange(8, 16)))
    assert skipped == 1 and w16.loss_scale == 5e37 and torch.equal(w16.flat.param, before)


def test_bf16_autocast_runs_and_needs_no_scaling() -> None:
    w = _worker("bf16")
    assert w.loss_scale == 1.0
    data = synthetic_data()
    for h in range(2):
        loss, _, skipped = _step(w, data.train_batch(np.arange(8 * h, 8 * h + 8)))
        assert skipped == 0 and torch.isfinite(loss)
    assert w.finite()


def test_language_model_presets_learn_every_token() -> None:
    """No padding_idx in a causal LM: the end-of-text token (id 0 here) must get gradient and start random."""
    model = models.ModelFactory(ModelConfig(name="llama-micro"), 64, 8, 0, 0).build(0)
    emb = model.get_input_embeddings()
    assert emb.padding_idx is None and emb.weight[0].abs().sum() > 0
    x = torch.zeros(1, 8, dtype=torch.long)
    model(input_ids=x, labels=x).loss.backward()
    assert emb.weight.grad[0].abs().sum() > 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_single_non_finite_parameter_makes_a_worker_non_finite(bad: float) -> None:
    w = _worker("fp32")
    assert w.finite()
    w.flat.param[w.flat.numel // 2] = bad
    assert not w.finite()
