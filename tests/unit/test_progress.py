"""The live display on a terminal and the plain lines elsewhere."""

from __future__ import annotations

import io
import re

from rich.console import Console

from adloco.telemetry.progress import PlainProgress, RichProgress, fmt_bytes, round_line

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
    p = PlainProgress()
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
    p = PlainProgress(clock=lambda: now[0])
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
