"""The command line end to end on a tiny setting, and bad input: one line, exit code 2, nothing written."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

TINY = [
    "--set",
    "model.name=llama-micro",
    "--set",
    "data.tokenizer=bpe:300",
    "--set",
    "data.seq_len=16",
    "--set",
    "data.val_fraction=0.2",
    "--set",
    "algorithm.rounds=3",
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
    "batch.eta=0.3",
]


def adloco(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "adloco", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def test_train_end_to_end(tmp_path: Path, text_corpus: Path) -> None:
    out = tmp_path / "runs"
    p = adloco("train", "--set", f"data.source={text_corpus}", "--set", f"logging.out_dir={out}", *TINY)
    assert p.returncode == 0, p.stderr
    (run,) = list(out.iterdir())
    summary = json.loads((run / "summary.json").read_text())
    keys = {
        "method",
        "rounds",
        "initial_val_ppl",
        "final_val_ppl",
        "final_val_loss",
        "trainers_final",
        "requests_final",
        "examples_total",
        "communications_total",
        "bytes_total",
        "wall_s",
    }
    assert keys <= set(summary)
    assert summary["method"] == "adloco" and summary["rounds"] == 3
    assert sum(summary["bytes_by_kind"].values()) == summary["bytes_total"] > 0
    assert summary["trainers_final"] == 1  # 4 trainers merged once a round
    assert summary["final_val_ppl"] < summary["initial_val_ppl"]
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rounds = [e["round"] for e in events if e["event"] == "round"]
    assert rounds == [1, 2, 3]
    assert {"start", "worker", "trainer", "merge", "allocation", "eval", "round", "end"} <= {
        e["event"] for e in events
    }
    cfg = (run / "config.yaml").read_text()
    assert "llama-micro" in cfg and "method: adloco" in cfg
    for name in ("val_ppl_vs_round.png", "val_ppl_vs_bytes.png", "requests.png", "trainers_alive.png"):
        assert (run / "plots" / name).stat().st_size > 1000
    # the saved model and tokenizer load with the Auto classes and reproduce the final validation loss
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(run / "model")
    tok = AutoTokenizer.from_pretrained(run / "model")
    ids = tok("def f(x):\n    return x\n", return_tensors="pt").input_ids
    assert ids.shape[1] > 1 and int(ids.max()) < model.config.vocab_size
    last = [e for e in events if e["event"] == "eval" and e["round"] == 3]
    assert math.isclose(min(e["val_loss"] for e in last), summary["final_val_loss"], rel_tol=1e-9)
    # every event and the summary read back into the typed schema with no key left over
    from adloco import events as schema

    typed = schema.read(run / "metrics.jsonl")
    assert len(typed) == len(events)
    for raw, ev in zip(events, typed, strict=True):
        assert ev.to_dict() == raw, raw["event"]
    assert schema.summary_from_dict(summary).to_dict() == summary
    # TensorBoard scalars (the package is installed with the dev extras: logging.tensorboard auto)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "val/val_ppl", "run/bytes_total", "request/trainer_0"} <= tags
    assert [s.step for s in acc.Scalars("train/loss")] == [1, 2, 3]
    assert acc.Scalars("val/val_ppl")[-1].value == pytest.approx(summary["final_val_ppl"], rel=1e-5)


def test_config_prints_every_field_with_its_doc() -> None:
    p = adloco("config")
    assert p.returncode == 0
    assert "inner_steps: 12" in p.stdout and "# H: inner OPTIMIZER steps" in p.stdout
    p = adloco("config", "--set", "algorithm.method=diloco", "--plain")
    assert "optimizer: nesterov" in p.stdout and "policy: none" in p.stdout


def test_version_is_the_package_version() -> None:
    import importlib.metadata

    import adloco as package

    p = adloco("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"adloco {package.__version__}"
    assert importlib.metadata.version("adloco") == package.__version__  # pyproject reads it from there


def test_help_names_every_method_and_no_command_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    from adloco.cli import main

    assert main([]) == 2
    out = capsys.readouterr().out
    assert "usage: adloco" in out and all(m in out for m in ("AdLoCo", "DiLoCo", "LocalSGD", "DDP"))


def test_config_lists_the_allowed_values_of_every_choice(capsys: pytest.CaptureFixture[str]) -> None:
    from adloco.cli import main

    assert main(["config"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if line.startswith("  ")}
    assert "# (norm | inner_product | augmented_inner_product | none) " in lines["test"]
    assert "(smallest | largest_with_smallest | none)" in lines["policy"]
    assert "(requests | demand)" in lines["allocation"]
    assert "(adloco | diloco | localsgd | ddp)" in lines["method"]


def test_config_prints_one_section(capsys: pytest.CaptureFixture[str]) -> None:
    from adloco.cli import main

    assert main(["config", "merge", "--set", "algorithm.method=diloco", "--plain"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "merge:" and "policy: none" in out and "\nbatch:" not in out
    assert main(["config", "batch"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("batch:\n  test: norm") and "# adaptive" not in out.splitlines()[0]
    assert len([line for line in out.splitlines() if not line.startswith("  ")]) == 1


def test_a_bench_section_is_ignored_by_train_and_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from adloco.cli import main
    from adloco.config import dump_yaml, resolve

    f = tmp_path / "with-bench.yaml"
    f.write_text("algorithm:\n  rounds: 3\nbench:\n  budget: 100\n  methods: {diloco: {outer.lr: 0.5}}\n")
    assert main(["config", "--config", str(f), "--plain"]) == 0
    out = capsys.readouterr().out
    assert "rounds: 3" in out and "bench" not in out and "budget: null" in out
    assert dump_yaml(resolve(f)) == dump_yaml(resolve(None, ["algorithm.rounds=3"]))
    assert main(["config", "bench"]) == 2
    assert "`adloco bench`'s own section" in capsys.readouterr().err


BAD = [
    (["--set", "batch.etta=0.5"], "config: unknown key 'batch.etta'; did you mean 'eta'?"),
    (["--set", "algorithm.inner_steps=0"], "config: algorithm.inner_steps = 0: must be >= 1"),
    (["--set", "batch.eta=-1"], "config: batch.eta = -1.0: must be > 0"),
    (["--set", "switch.kappa=0.5"], "config: switch.kappa = 0.5: must be >= 1"),
    (["--set", "switch.b_max=0"], "config: switch.b_max = 0: must be >= 1"),
    (["--set", "algorithm.trainers=5"], "config: algorithm.trainers = 5: must be <= algorithm.workers (4)"),
    (["--set", "algorithm.rounds=ten"], "config: algorithm.rounds = 'ten': must be an integer"),
    (
        ["--set", "algorithm.method=sgd"],
        "config: algorithm.method = 'sgd': must be one of 'adloco', 'diloco', 'localsgd'",
    ),
    (["--set", "nosuch.key=1"], "config: unknown section 'nosuch'"),
    (
        ["--set", "data.source=/nonexistent/corpus"],
        "data.source = '/nonexistent/corpus': no such file or folder",
    ),
    (["--set", "algorithm.seed=-1"], "config: algorithm.seed = -1: must be in [0, 2**31)"),
    (["--set", "runtime.threads=99999999999"], "config: runtime.threads = 99999999999: must be in [0, 4096]"),
    (
        ["--set", "data.tokenizer=bpe:99999999999"],
        "config: data.tokenizer = 'bpe:99999999999': must be 'bpe:<vocab size>'",
    ),
    (["--set", "logging.name=a/b"], "config: logging.name = 'a/b': must be a plain name"),
    (["--set", "logging.name=.."], "config: logging.name = '..': must be a plain name"),
    (["--set", "batch.max=10000000000"], "config: batch.max = 10000000000: must be <= 1048576"),
    (
        ["--set", "data.cache_dir=/dev/null/cache", "--set", "data.source=CORPUS"],
        "cache folder '/dev/null/cache",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_input_one_line_exit_2_nothing_written(
    tmp_path: Path, text_corpus: Path, args: list[str], message: str
) -> None:
    args = [a.replace("CORPUS", str(text_corpus)) for a in args]
    out = tmp_path / "runs"
    p = adloco("train", "--set", f"logging.out_dir={out}", *args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("adloco: error: ") and message in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not out.exists() or not any(out.iterdir())


def test_malformed_yaml(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("algorithm:\n  rounds: [1,\n")
    p = adloco("train", "--config", str(f))
    assert p.returncode == 2
    assert p.stderr.startswith(f"adloco: error: config file '{f}': malformed YAML at line")
    assert len(p.stderr.strip().splitlines()) == 1


def test_empty_corpus(tmp_path: Path) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("   \n")
    (tmp_path / "corpus" / "b.txt").write_text("")
    p = adloco(
        "train",
        "--set",
        f"data.source={tmp_path / 'corpus'}",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    )
    assert p.returncode == 2 and "every document is empty" in p.stderr
    assert not (tmp_path / "runs").exists()


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    p = adloco("train", "--debug", "--set", "batch.eta=-1")
    assert p.returncode != 0 and "Traceback" in p.stderr


def test_a_file_without_the_text_field(tmp_path: Path) -> None:
    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join(json.dumps({"body": f"row {i}"}) for i in range(10)))
    p = adloco("train", "--set", f"data.source={f}", "--set", f"logging.out_dir={tmp_path / 'runs'}")
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "adloco: error: data file 'rows.jsonl': no field 'text' (fields: body); set data.text_field"
    )
    assert not (tmp_path / "runs").exists()


def test_an_empty_validation_split(tmp_path: Path) -> None:
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "big.txt").write_text(" ".join(f"w{i}" for i in range(3000)))
    (d / "small.txt").write_text("tiny")
    p = adloco(
        "train",
        "--set",
        f"data.source={d}",
        "--set",
        "data.val_fraction=0.5",
        "--set",
        "data.seq_len=64",
        "--set",
        "data.tokenizer=bpe:300",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    )
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("adloco: error: data: the ") and "split holds" in line
    assert not (tmp_path / "runs").exists()
