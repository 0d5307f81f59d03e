"""A stop that says what it did, in this process: Ctrl-C (SIGINT) part-way through a round is acknowledged
at once with what will happen; the run undoes that round, writes a checkpoint of the last whole one, its
summary as stopped.json (``stopped``: not summary.json, which says a run finished, as a bench and
`adloco report` read it) and its plots, and ends with the command that resumes it, which runs as printed
and finishes the run (its summary.json then, the stopped.json gone). The same stops of a process of its own: tests/integration/test_faults.py."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from adloco.cli import main
from adloco.engine import threads
from adloco.engine.dist.env import program
from tests.helpers import RESUME_RUN, only_run, rounds_logged, set_args

H = int(RESUME_RUN["algorithm.inner_steps"])


def stop_at(monkeypatch: pytest.MonkeyPatch, round_: int, step: int) -> None:
    """SIGINT to this process before inner step ``step`` (1-based) of ``round_`` (the check between steps)."""
    calls = [0]

    def check(self: threads.AutoThreads) -> int:
        calls[0] += 1
        if calls[0] == (round_ - 1) * H + step:
            os.kill(os.getpid(), signal.SIGINT)
        return self.threads

    monkeypatch.setattr(threads.AutoThreads, "check", check)


@pytest.mark.long
def test_ctrl_c_says_at_once_what_happens_and_leaves_a_summary_and_plots(
    tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs"
    stop_at(monkeypatch, round_=3, step=2)
    args = set_args(
        RESUME_RUN, data__source=str(text_corpus), logging__out_dir=str(out), logging__plots="true"
    )
    assert main(["train", *args]) == 130
    run = only_run(out)
    err = capsys.readouterr().err.strip().splitlines()
    ck = run / "checkpoints" / "round-000002"
    assert err[0] == (
        "adloco: SIGINT received: stopping at the end of this inner step; round 3 will be undone and the run "
        f"saved as of round 2 (checkpoint {ck}, stopped.json, plots); another signal is ignored while it saves"
    )
    assert not (run / "summary.json").exists()  # the run did not finish
    summary = json.loads((run / "stopped.json").read_text())
    assert summary["stopped"] == "SIGINT" and summary["rounds"] == 2
    assert err[1] == f"adloco: stopped by SIGINT in round 3: round 3 undone; checkpoint written: {ck}"
    assert err[2] == (
        f"after 2 round(s): validation perplexity {summary['initial_val_ppl']:.2f} -> "
        f"{summary['final_val_ppl']:.2f}; summary: {run / 'stopped.json'}"
    )
    assert err[3:] == [f"plots: {run / 'plots'}", f"resume with: {program()} train --resume {run}"]
    assert (run / "plots" / "val_ppl_vs_round.png").is_file()
    assert rounds_logged(run) == [1, 2]
    monkeypatch.undo()
    resume = err[-1].removeprefix(f"resume with: {program()} ").split()
    assert main(resume) == 0  # the hint, as printed
    done = json.loads((run / "summary.json").read_text())
    assert done["stopped"] is None and done["rounds"] == int(RESUME_RUN["algorithm.rounds"])
    assert not (run / "stopped.json").exists()


def test_a_stop_in_the_first_round_names_the_command_that_draws_plots(
    tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs"
    stop_at(monkeypatch, round_=1, step=2)
    assert (
        main(["train", *set_args(RESUME_RUN, data__source=str(text_corpus), logging__out_dir=str(out))])
        == 130
    )
    run = only_run(out)
    err = capsys.readouterr().err.strip().splitlines()
    assert "stopped.json); another signal" in err[0]  # logging.plots false: none promised
    assert json.loads((run / "stopped.json").read_text())["rounds"] == 0
    assert err[-2:] == [
        f"plots and report: {program()} report {run}",
        f"resume with: {program()} train --resume {run}",
    ]


def test_the_program_a_printed_command_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """After `make train` adloco is .venv/bin/adloco, not on PATH: a printed command names that path."""
    import sys

    from adloco.engine.dist import env

    monkeypatch.delenv(env.PROGRAM_ENV, raising=False)
    script = tmp_path / ".venv" / "bin" / "adloco"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [".venv/bin/adloco", "train"])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert env.program() == ".venv/bin/adloco"
    monkeypatch.setenv("PATH", str(script.parent))  # activated: PATH finds this very program
    monkeypatch.setattr(sys, "argv", [str(script), "train"])
    assert env.program() == "adloco"
    monkeypatch.setattr(sys, "argv", ["/somewhere/adloco/__main__.py", "train"])  # python -m adloco
    assert env.program() == f"{sys.executable} -m adloco"
    monkeypatch.setenv(env.PROGRAM_ENV, ".venv/bin/adloco")  # a process adloco train --nproc started
    assert env.program() == ".venv/bin/adloco"
