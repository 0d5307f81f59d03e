"""The first lines of every run name what is in effect: the method, the model and its parameters, the
workers and trainers, the inner and outer optimizer, the wire of Δ and of θ, and the overlap, read from
the resolved config (so a preset's choices show as the user's do)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adloco.cli import main
from adloco.config import resolve
from adloco.engine.describe import describe_run
from tests.helpers import TINY_QUIET, S


def lines(*sets: str) -> list[str]:
    return describe_run(resolve(None, list(sets)), 1_380_000, "D", "cpu")


def test_the_defaults_say_what_they_are() -> None:
    assert lines() == [
        "adloco: llama-tiny, 1.38M parameters, 4 workers, 4 trainers, D, device cpu",
        "optimizers: inner auto lr 0.004, cosine schedule; outer average (θ ← the workers' mean)",
        "wire: Δ float32, θ float32 (merges, moves); overlap none (each round waits for its Δ)",
    ]  # inner.optimizer auto before a run chose: said as set
    cfg = resolve(None, [])
    assert describe_run(cfg, 1, "D", "cpu", ns_dtype="float32", optimizer="muon")[1] == (
        "optimizers: inner muon (auto: every process on a CPU) lr 0.004, cosine schedule, Muon lr ×1, "
        "Newton–Schulz in float32 (auto, a CPU without native bfloat16 matmuls); outer average (θ ← the workers' mean)"
    )
    assert describe_run(cfg, 1, "D", "cuda", optimizer="adamw")[1].startswith(
        "optimizers: inner adamw (auto: a GPU, where Muon is not yet timed) lr 0.004, cosine schedule; outer"
    )
    classifier = resolve(None, ["model.task=classification", "model.name=llama-micro"])
    assert describe_run(classifier, 1, "D", "cpu", optimizer="adamw")[1].startswith(
        "optimizers: inner adamw (auto: a classification model, where Muon is not measured) lr"
    )
    set_ = resolve(None, ["inner.optimizer=adamw"])  # a setting is itself, whatever the run would choose
    assert describe_run(set_, 1, "D", "cpu", optimizer="adamw")[1].startswith(
        "optimizers: inner adamw lr 0.004"
    )


@pytest.mark.parametrize(
    "sets,line,said",
    [
        (
            ["comm.dtype=int4", "comm.error_feedback=true"],
            2,
            "wire: Δ int4 (blocks of 256), error feedback on, θ",
        ),
        (["comm.theta_dtype=int8"], 2, "θ int8 (blocks of 256) (merges, moves)"),
        (
            ["comm.dtype=topk"],
            2,
            "Δ topk (1.56% of blocks of 4096, 2-bit values), error feedback on (decay β 0.95)",
        ),
        (["comm.dtype=topk"], 2, "θ int4 (blocks of 256), following Δ (merges, moves)"),
        (
            ["comm.dtype=int4"],
            2,
            "Δ int4 (blocks of 256), error feedback off, θ int4 (blocks of 256), following Δ",
        ),
        (["sync.overlap=eager"], 2, "overlap eager (workers go on from their own Δ's step while it travels)"),
        (["sync.overlap=delayed"], 2, "overlap delayed (Δ lands a round late)"),
        (["sync.fragments=4", "algorithm.inner_steps=12"], 2, "overlap streaming in 4 fragments"),
        (
            ["algorithm.method=diloco"],
            1,
            "outer sgd lr 0.5",
        ),  # the preset's step (RESULTS, DiLoCo's outer step)
        (["algorithm.method=diloco", "outer.optimizer=nesterov"], 1, "outer nesterov lr 0.5 momentum 0.9"),
        (["algorithm.method=diloco"], 0, "diloco: llama-tiny, 1.38M parameters, 4 workers, 1 trainer, D"),
        (["algorithm.method=localsgd"], 1, "optimizers: inner sgd lr 0.2, cosine schedule; outer average"),
        (
            ["algorithm.method=ddp"],
            2,
            "wire: gradients float32 every step, θ float32 (merges, moves); overlap none (synchronous)",
        ),
        (["inner.optimizer=muon"], 1, "inner muon lr 0.004, cosine schedule, Muon lr ×1"),
        (["outer.optimizer=sgd", "outer.lr=0.5"], 1, "outer sgd lr 0.5"),
    ],
)
def test_each_setting_shows_in_the_first_lines(sets: list[str], line: int, said: str) -> None:
    assert said in lines(*sets)[line]


def test_a_run_prints_them_first(
    tmp_path: Path, text_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sets = S(
        f"data.source={text_corpus}", f"logging.out_dir={tmp_path}", *TINY_QUIET, "logging.progress=plain"
    )
    assert main(["train", *sets, *S("comm.dtype=int8", "sync.overlap=delayed")]) == 0
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, x in enumerate(out) if x.startswith("adloco: llama-micro"))
    assert "4 workers, 4 trainers" in out[start] and "device cpu, 1 thread(s)" in out[start]
    assert out[start + 1].startswith("optimizers: inner muon (auto: every process on a CPU) lr ")
    assert out[start + 2].startswith(
        "wire: Δ int8 (blocks of 256), error feedback off, θ int8 (blocks of 256), following Δ (merges, moves); "
        "overlap delayed"
    )
    assert out[start + 3].startswith("run directory ")  # before anything else of the run


def test_a_run_says_which_outer_step_the_codec_brought(
    tmp_path: Path, text_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DiLoCo with topk and no outer step set: the first lines say the step in effect (SGD lr 1) and why,
    before anything else of the run."""
    sets = S(
        f"data.source={text_corpus}", f"logging.out_dir={tmp_path}", *TINY_QUIET, "logging.progress=plain"
    )
    assert main(["train", *sets, *S("algorithm.method=diloco", "comm.dtype=topk", "algorithm.rounds=1")]) == 0
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, x in enumerate(out) if x.startswith("diloco: llama-micro"))
    assert out[start + 1].startswith("optimizers: inner muon (auto: ") and "outer sgd lr 1" in out[start + 1]
    assert out[start + 3].startswith(
        "outer step: sgd at lr 1, no momentum, in place of diloco's sgd at lr 0.5: comm.dtype topk brings "
        "SparseLoCo's"
    )
    assert out[start + 4].startswith("run directory ")


def test_a_run_says_which_inner_keys_its_optimizer_does_not_read(
    tmp_path: Path, text_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An inner key set away from its default that the inner optimizer in effect does not read (Muon's with
    AdamW, SGD's momentum) is said in one line at the start, kept as set: a bench's shared --set reaches
    the variants that read it, so it is not refused."""
    from adloco.config import resolve
    from adloco.engine.describe import unread_note

    sets = S(
        f"data.source={text_corpus}", f"logging.out_dir={tmp_path}", *TINY_QUIET, "logging.progress=plain"
    )
    assert (
        main(
            ["train", *sets, *S("inner.optimizer=adamw", "inner.muon_ns_dtype=float32", "algorithm.rounds=1")]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, x in enumerate(out) if x.startswith("adloco: llama-micro"))
    assert out[start + 3] == (
        "inner.optimizer adamw does not read inner.muon_ns_dtype float32 (read by muon): kept as set, with no "
        "effect"
    )
    assert out[start + 4].startswith("run directory ")
    said = unread_note(
        resolve(None, ["algorithm.method=localsgd", "inner.betas=[0.8,0.9]", "inner.momentum=0.5"])
    )
    assert (
        said
        == "inner.optimizer sgd does not read inner.betas [0.8, 0.9] (read by adamw or muon): kept as set, with no effect"
    )
    assert unread_note(resolve(None, ["inner.optimizer=muon", "inner.muon_ns_dtype=float32"])) is None
    assert unread_note(resolve(None, [])) is None
    # auto reads what either choice reads (a config compared before its device decides)
    assert unread_note(resolve(None, ["inner.muon_ns_dtype=float32", "inner.betas=[0.8,0.9]"])) is None


def test_a_muon_run_says_what_its_auto_dtype_became(
    tmp_path: Path, text_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``inner.muon_ns_dtype: auto`` (the default) is said at the start as the dtype the run chose, and why
    where it is float32; config.yaml keeps auto, as the user left it."""
    import yaml

    from adloco.library.optim import ns_dtype_for

    sets = S(
        f"data.source={text_corpus}", f"logging.out_dir={tmp_path}", *TINY_QUIET, "logging.progress=plain"
    )
    assert main(["train", *sets, *S("inner.optimizer=muon", "algorithm.rounds=1")]) == 0
    out = capsys.readouterr().out.splitlines()
    line = out[next(i for i, x in enumerate(out) if x.startswith("adloco: llama-micro")) + 1]
    chosen = ns_dtype_for("auto", "cpu")
    why = ", a CPU without native bfloat16 matmuls" if chosen == "float32" else ""
    assert f"Newton–Schulz in {chosen} (auto{why});" in line
    (config,) = tmp_path.glob("*/config.yaml")
    assert yaml.safe_load(config.read_text())["inner"]["muon_ns_dtype"] == "auto"
