"""The command line end to end, as a shell runs it: a tiny training run and everything it writes, and bad
input (one line, exit code 2, nothing written). The commands' options and messages are tested in-process
(tests/unit/test_commands.py, tests/unit/test_bad_input.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import TINY_RUN, adloco_process, set_args


def test_train_end_to_end(tmp_path: Path, text_corpus: Path) -> None:
    out = tmp_path / "runs"
    p = adloco_process("train", *set_args(TINY_RUN, data__source=str(text_corpus), logging__out_dir=str(out)))
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


def test_bad_input_is_one_line_and_exit_2_from_the_process(tmp_path: Path) -> None:
    """The process as a shell sees it (tests/unit/test_bad_input.py holds every case, in-process)."""
    out = tmp_path / "runs"
    p = adloco_process("train", "--set", f"logging.out_dir={out}", "--set", "batch.eta=-1")
    assert p.returncode == 2 and p.stderr == "adloco: error: config: batch.eta = -1.0: must be > 0\n"
    assert not out.exists()
    p = adloco_process("train", "--debug", "--set", "batch.eta=-1")
    assert p.returncode != 0 and "Traceback" in p.stderr
