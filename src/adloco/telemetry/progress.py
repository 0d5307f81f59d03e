"""Live progress: a rich bar and a line per round on a terminal, plain lines elsewhere (a log file, a
pipe), with a line at least every 10 s within a round there too."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def requests_text(requests: dict[Any, int]) -> str:
    """Every trainer's request b as ``t0=8 t2=12`` (trainer id = request)."""
    return " ".join(f"t{t}={b}" for t, b in requests.items())


def round_line(s: dict[str, Any], rounds: int) -> str:
    """One human line for a round summary event."""
    # the requests the round ran with (as the requests plot draws them); trainers: those that ran, and
    # how many are left when the round merged some
    reqs = requests_text(s["requests"])
    ran, alive = len(s["requests"]), s["trainers_alive"]
    trainers = f"{ran}" if alive == ran else f"{ran}->{alive}"
    if isinstance(s.get("val_accuracy"), (int, float)):
        val_txt = f"val acc {100 * s['val_accuracy']:6.2f}%"
    else:
        ppl = s.get("val_ppl")
        val_txt = "val ppl " + (f"{ppl:8.2f}" if isinstance(ppl, (int, float)) else "       -")
    loss = s.get("loss")
    loss_txt = f"{loss:6.3f}" if isinstance(loss, (int, float)) else "     -"
    return (
        f"round {s['round']:>3}/{rounds}  loss {loss_txt}  {val_txt}  "
        f"trainers {trainers}  requests {reqs}  "
        f"sent {fmt_bytes(s['bytes_total'])} total  round {s['round_s']:5.1f}s"
    )


def initial_text(m: dict[str, Any]) -> str:
    """'validation perplexity 4208.02' (or accuracy, for classification) before training."""
    if isinstance(m.get("val_accuracy"), (int, float)):
        return f"validation accuracy {100 * m['val_accuracy']:.2f}%"
    ppl = m.get("val_ppl")
    return (
        f"validation perplexity {ppl:.2f}" if isinstance(ppl, (int, float)) else "validation perplexity inf"
    )


class Progress:
    """Base: silent."""

    def start(self, rounds: int, steps_per_round: int, initial: dict[str, Any]) -> None:
        self.rounds = rounds

    def round_started(self, r: int) -> None:
        pass

    def step(self, n: int = 1, examples: int = 0) -> None:
        """``n`` inner steps done (one per local worker), on ``examples`` rows in all."""

    def round_done(self, summary: dict[str, Any]) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class PlainProgress(Progress):
    """One line a round (logs, CI, pipes), and within a round a line at least every ``every`` seconds:
    the inner steps done and the examples a second so far."""

    def __init__(self, every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.clock = every, clock

    def start(self, rounds: int, steps_per_round: int, initial: dict[str, Any]) -> None:
        self.rounds, self.steps_per_round = rounds, steps_per_round
        self.round_started(0)
        print(f"initial {initial_text(initial)}", flush=True)

    def round_started(self, r: int) -> None:
        self.r, self.steps, self.examples = r, 0, 0
        self.t0 = self.last = self.clock()

    def step(self, n: int = 1, examples: int = 0) -> None:
        self.steps += n
        self.examples += examples
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            rate = self.examples / (now - self.t0) if now > self.t0 else 0.0
            print(
                f"round {self.r:>3}/{self.rounds}  inner steps {self.steps}/{self.steps_per_round} done  "
                f"{rate:,.1f} examples/s",
                flush=True,
            )

    def round_done(self, summary: dict[str, Any]) -> None:
        print(round_line(summary, self.rounds), flush=True)
        self.last = self.clock()

    def message(self, text: str) -> None:
        print(text, flush=True)


class RichProgress(Progress):
    """A live bar over inner steps, with the round's lines printed above it."""

    def __init__(self, console: Any = None) -> None:
        self._console = console

    def start(self, rounds: int, steps_per_round: int, initial: dict[str, Any]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.rounds = rounds
        self.console = self._console or Console()
        self.bar = Progress(
            TextColumn("[bold]round {task.fields[r]}/{task.fields[rounds]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("inner steps"),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.task = self.bar.add_task("train", total=steps_per_round, r=0, rounds=rounds)
        self.bar.start()
        self.console.print(f"initial {initial_text(initial)}")

    def round_started(self, r: int) -> None:
        self.bar.reset(self.task, r=r, rounds=self.rounds)  # reset replaces the fields

    def step(self, n: int = 1, examples: int = 0) -> None:
        self.bar.advance(self.task, n)

    def round_done(self, summary: dict[str, Any]) -> None:
        self.console.print(round_line(summary, self.rounds))

    def message(self, text: str) -> None:
        if hasattr(self, "console"):
            self.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if hasattr(self, "bar"):
            self.bar.stop()


def make_progress(mode: str) -> Progress:
    if mode == "off":
        return Progress()
    if mode == "rich" or (mode == "auto" and sys.stdout.isatty()):
        return RichProgress()
    return PlainProgress()


class _LogToProgress(logging.Handler):
    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        self.say(record.getMessage())


@contextlib.contextmanager
def library_log_to(say: Callable[[str], None]) -> Iterator[None]:
    """The library's log lines (``logging.getLogger("adloco")``: its warnings, what it decided) as
    progress messages while the block runs, and not on the root logger as well."""
    log = logging.getLogger("adloco")
    handler, propagate = _LogToProgress(say), log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.propagate = propagate
