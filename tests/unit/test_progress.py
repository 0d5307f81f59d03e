"""The live display on a terminal and the plain lines elsewhere: a line at least every 10 s whatever the
run is doing, and the time left estimated from the examples left, not the rounds."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from rich.console import Console

from adloco.telemetry.progress import (
    PlainProgress,
    Remaining,
    RichProgress,
    Work,
    duration,
    fmt_bytes,
    round_line,
)

SUMMARY = {
    "round": 2,
    "requests": {"0": 8, "2": 12},
    "val_ppl": 123.456,
    "loss": 4.5,
    "trainers_alive": 2,
    "bytes_total": 12_345_678,
    "round_s": 3.2,
}


def test_rich_progress_on_a_terminal() -> None:
    buf = io.StringIO()
    p = RichProgress(Console(file=buf, force_terminal=True, width=120))
    p.start(rounds=3, steps_per_round=4, initial={"val_ppl": 900.0})
    for r in (1, 2):
        p.round_started(r)
        for _ in range(4):
            p.step()
        p.round_done({**SUMMARY, "round": r})
    p.message("a note")
    p.close()
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())  # drop terminal control sequences
    assert "round 2/3" in out  # the live bar
    assert "initial validation perplexity" in out and "round   2/3" in out and "a note" in out


def test_plain_lines(capsys) -> None:  # type: ignore[no-untyped-def]
    p = PlainProgress(thread=False)
    p.start(3, 4, {"val_ppl": 900.0})
    p.round_done(SUMMARY)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "initial validation perplexity 900.00"
    assert out[1] == round_line(SUMMARY, 3)
    assert "val ppl   123.46" in out[1] and "requests t0=8 t2=12" in out[1] and "sent 12.3 MB" in out[1]


def test_fmt_bytes() -> None:
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(1_500) == "1.5 KB"
    assert fmt_bytes(2_000_000_000) == "2.0 GB"


def test_plain_lines_within_a_round_at_least_every_ten_seconds(capsys) -> None:  # type: ignore[no-untyped-def]
    """Piped output (a log file) is not silent for a whole round: a line every 10 s with the inner steps
    done and the examples a second; none when the round is quicker."""
    now = [0.0]
    p = PlainProgress(clock=lambda: now[0], thread=False)
    p.start(3, 40, {"val_ppl": 900.0})
    p.round_started(1)
    for _ in range(40):
        now[0] += 0.6  # 24 s for the round: lines after 10.2 s and 20.4 s
        p.step(1, 16)
    p.round_done(SUMMARY)
    p.round_started(2)
    for _ in range(40):
        now[0] += 0.1
        p.step(1, 16)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"round   1/3  inner steps 17/40 done  {17 * 16 / 10.2:,.1f} examples/s"
    assert out[2] == f"round   1/3  inner steps 34/40 done  {34 * 16 / 20.4:,.1f} examples/s"
    assert out[3] == round_line(SUMMARY, 3)
    assert len(out) == 4  # round 2 took 4 s: no line within it


def test_the_round_line_says_what_its_numbers_are() -> None:
    line = round_line(SUMMARY, 3)
    assert "sent 12.3 MB total" in line and line.endswith("round   3.2s")


DEMO = Work(rounds=8, inner_steps=12, workers=4, batch_max=32)  # the demo's shape


def test_the_time_left_follows_the_examples_left() -> None:
    """After round 1 (16 rows a step in 4 s): at least 7 rounds at 16 rows a step, at most at 4 x 32."""
    now = [0.0]
    rem = Remaining(DEMO, 48, clock=lambda: now[0])
    assert rem.text() == ""  # nothing measured yet
    rem.round_started(1)
    rem.round_done({"round": 1, "examples": 192, "round_s": 4.0, "examples_total": 192})
    low, high = rem.seconds() or (0, 0)
    assert low == pytest.approx(7 * 12 * 16 * 4 / 192) and high == pytest.approx(7 * 12 * 128 * 4 / 192)
    assert rem.text() == "28 s to 3.7 min left"
    rem.round_started(2)  # half of round 2 in 6 s: 6 s more of it, then 6 rounds
    now[0] += 6.0
    rem.step(24)
    assert rem.seconds() == pytest.approx((6.0 + 6 * 12 * 16 * 4 / 192, 6.0 + 6 * 12 * 128 * 4 / 192))
    rem.round_done({"round": 7, "examples": 1536, "round_s": 24.0, "examples_total": 9000})
    assert rem.text() == "about 24 s left"  # requests at their cap: one number
    fixed = Remaining(Work(8, 12, 4, 32, grows=False, budget=9500), 48)
    fixed.round_done({"round": 4, "examples": 1536, "round_s": 24.0, "examples_total": 9000})
    assert fixed.text() == "about 8 s left"  # the budget's 500 examples, not 4 rounds
    assert [duration(x) for x in (0.2, 40, 150, 1800, 7200)] == ["1 s", "40 s", "2.5 min", "30 min", "2.0 h"]


def test_a_line_every_ten_seconds_while_a_round_ends(capsys) -> None:  # type: ignore[no-untyped-def]
    """Evaluation, a checkpoint or one long step print nothing themselves: the ticker says where the run is."""
    now = [0.0]
    p = PlainProgress(clock=lambda: now[0], thread=False)
    p.start(8, 4, {"val_ppl": 900.0}, DEMO)
    p.round_started(1)
    for _ in range(4):
        now[0] += 1.0
        p.step(1, 16)
    for _ in range(25):  # 25 s of the round's end with no call from the run
        now[0] += 1.0
        p.tick()
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "round   1/8  inner steps 4/4 done  6.4 examples/s  (ending the round: synchronizing, evaluating)",
        "round   1/8  inner steps 4/4 done  3.2 examples/s  (ending the round: synchronizing, evaluating)",
    ]
    p.round_done({**SUMMARY, "round": 1, "examples": 64, "round_s": 30.0, "examples_total": 64})
    assert capsys.readouterr().out.rstrip().endswith("3.5 min to 84 min left")


def test_the_ticker_thread_prints_when_the_run_is_silent(capsys) -> None:  # type: ignore[no-untyped-def]
    now = [0.0]
    p = PlainProgress(clock=lambda: now[0])
    p.start(8, 48, {"val_ppl": 900.0}, DEMO)
    p.round_started(1)
    p.step(4, 64)
    now[0] = 11.0  # 11 s with nothing printed, the run busy in a long step
    seen = ""
    while "inner steps 4/48 done" not in seen:  # the thread looks at least once a second
        time.sleep(0.05)
        seen += capsys.readouterr().out
    p.close()
    assert p._ticker is None


def test_a_run_says_the_time_left_after_each_round(
    tmp_path: Path, text_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from adloco.cli import main
    from tests.helpers import TINY_QUIET, S

    sets = S(
        f"data.source={text_corpus}", f"logging.out_dir={tmp_path}", *TINY_QUIET, "logging.progress=plain"
    )
    assert main(["train", *sets, *S("algorithm.rounds=3")]) == 0
    rounds = [x for x in capsys.readouterr().out.splitlines() if x.startswith("round ") and "val ppl" in x]
    assert len(rounds) == 3 and all(x.endswith(" left") for x in rounds[:2]) and "left" not in rounds[2]
