"""Live progress: a rich bar and a line per round on a terminal, plain lines elsewhere (a log file, a
pipe), with a line at least every 10 s there too, whatever the run is doing; both say the time left,
estimated from the examples left (:class:`Remaining`)."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


def duration(seconds: float) -> str:
    """'40 s', '2.5 min', '14 min', '1.2 h'."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


@dataclass(frozen=True)
class Work:
    """What a run has to do, for the estimate of the time it has left: ``rounds`` of ``inner_steps``
    steps of ``workers`` workers, each step at most ``batch_max`` rows a worker; ``grows``: requests may
    grow (a batch test or schedule), up to ``batch_max``; ``budget``: the examples that end the run."""

    rounds: int
    inner_steps: int
    workers: int
    batch_max: int
    grows: bool = True
    budget: int | None = None


class Remaining:
    """The time a run has left, from the examples it has left rather than its rounds: a growing request
    puts most of the examples into the last rounds, so rounds left times a round's time says far too
    little early on. Examples left are a range: at least the rows a step reads now, for every step left
    (requests never shrink), at most ``batch_max`` rows per worker and step once requests may grow;
    each at the seconds an example took in the last round (evaluation and synchronization included).
    Within a round, this round's steps left at its own rows. Nothing is said before a round has ended."""

    def __init__(self, work: Work, steps_per_round: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.work, self.steps_per_round, self.clock = work, steps_per_round, clock
        self.round, self.steps, self.t0, self.seconds_per_example = 0, 0, clock(), 0.0
        self.global_rows = 0.0  # every worker's rows in one inner step, in the last round
        self.examples_total = 0

    def round_started(self, r: int) -> None:
        self.round, self.steps, self.t0 = r, 0, self.clock()

    def step(self, n: int) -> None:
        self.steps += n

    def round_done(self, summary: dict[str, Any]) -> None:
        examples, seconds = summary.get("examples") or 0, summary.get("round_s") or 0.0
        if examples > 0 and seconds > 0:
            self.seconds_per_example = seconds / examples
            self.global_rows = examples / self.work.inner_steps
        self.examples_total = summary.get("examples_total") or self.examples_total
        self.round, self.steps = int(summary.get("round", self.round)), self.steps_per_round

    def seconds(self) -> tuple[float, float] | None:
        """(at least, at most) seconds left; None before a round has ended."""
        w, spe = self.work, self.seconds_per_example
        if spe <= 0:
            return None
        rounds_after = max(0, w.rounds - self.round)
        low_rows = self.global_rows
        high_rows = max(low_rows, float(w.workers * w.batch_max)) if w.grows else low_rows
        low = rounds_after * w.inner_steps * low_rows
        high = rounds_after * w.inner_steps * high_rows
        if w.budget is not None:
            left = max(0.0, w.budget - self.examples_total)
            low, high = min(low, left), min(high, left)
        in_round = 0.0  # this round's steps left, at the pace of its steps so far
        if 0 < self.steps < self.steps_per_round:
            in_round = (self.steps_per_round - self.steps) * (self.clock() - self.t0) / self.steps
        return in_round + low * spe, in_round + high * spe

    def text(self) -> str:
        """'about 2.5 min left', '1.2 min to 6.0 min left', or '' before a round has ended."""
        got = self.seconds()
        if got is None:
            return ""
        low, high = got
        if high <= 1.15 * low + 5:
            return f"about {duration(high)} left"
        return f"{duration(low)} to {duration(high)} left"


class Progress:
    """Base: silent."""

    def start(
        self, rounds: int, steps_per_round: int, initial: dict[str, Any], work: Work | None = None
    ) -> None:
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
    """One line a round (logs, CI, pipes), and a line at least every ``every`` seconds whatever the run is
    doing (a long inner step of one worker, the round's end, evaluation, a checkpoint): the inner steps
    done, the examples a second so far and the time left. A thread of its own prints those when nothing
    else did (:meth:`tick`); ``thread=False`` leaves calling it to the caller (tests, with a fake clock)."""

    def __init__(
        self, every: float = 10.0, clock: Callable[[], float] = time.monotonic, thread: bool = True
    ) -> None:
        self.every, self.clock, self.thread = every, clock, thread
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.remaining: Remaining | None = None
        self.r, self.steps, self.examples = 0, 0, 0
        self.rounds, self.steps_per_round = 0, 0
        self.t0 = self.last = clock()

    def start(
        self, rounds: int, steps_per_round: int, initial: dict[str, Any], work: Work | None = None
    ) -> None:
        self.rounds, self.steps_per_round = rounds, steps_per_round
        self.remaining = Remaining(work, steps_per_round, self.clock) if work is not None else None
        self.round_started(0)
        self._print(f"initial {initial_text(initial)}")
        if self.thread and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick_every, name="adloco-progress", daemon=True)
            self._ticker.start()

    def round_started(self, r: int) -> None:
        self.r, self.steps, self.examples = r, 0, 0
        self.t0 = self.clock()
        if self.remaining is not None:
            self.remaining.round_started(r)

    def step(self, n: int = 1, examples: int = 0) -> None:
        self.steps += n
        self.examples += examples
        if self.remaining is not None:
            self.remaining.step(n)
        self.tick()

    def _status(self, now: float) -> str:
        rate = self.examples / (now - self.t0) if now > self.t0 else 0.0
        doing = (
            "  (ending the round: synchronizing, evaluating)"
            if self.steps >= self.steps_per_round > 0
            else ""
        )
        left = self.remaining.text() if self.remaining is not None else ""
        return (
            f"round {self.r:>3}/{self.rounds}  inner steps {self.steps}/{self.steps_per_round} done  "
            f"{rate:,.1f} examples/s" + (f"  {left}" if left else "") + doing
        )

    def tick(self) -> None:
        """A status line if nothing was printed for ``every`` seconds."""
        now = self.clock()
        with self._lock:
            if now - self.last < self.every or self.r == 0:
                return
            self.last = now
            line = self._status(now)
        print(line, flush=True)

    def _tick_every(self) -> None:
        while not self._stop.wait(min(1.0, self.every / 4)):
            self.tick()

    def _print(self, text: str) -> None:
        with self._lock:
            self.last = self.clock()
            print(text, flush=True)

    def round_done(self, summary: dict[str, Any]) -> None:
        line = round_line(summary, self.rounds)
        if self.remaining is not None:
            self.remaining.round_done(summary)
            left = self.remaining.text() if summary.get("round", 0) < self.rounds else ""
            line += f"  {left}" if left else ""
        self._print(line)
        self.steps = self.steps_per_round

    def message(self, text: str) -> None:
        self._print(text)

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
            self._ticker = None


class RichProgress(Progress):
    """A live bar over inner steps with the time left, the round's lines printed above it."""

    def __init__(self, console: Any = None) -> None:
        self._console = console
        self.remaining: Remaining | None = None

    def start(
        self, rounds: int, steps_per_round: int, initial: dict[str, Any], work: Work | None = None
    ) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.rounds = rounds
        self.remaining = Remaining(work, steps_per_round) if work is not None else None
        self.console = self._console or Console()
        self.bar = Progress(
            TextColumn("[bold]round {task.fields[r]}/{task.fields[rounds]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("inner steps"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[left]}"),
            console=self.console,
            transient=True,
        )
        self.task = self.bar.add_task("train", total=steps_per_round, r=0, rounds=rounds, left="")
        self.bar.start()
        self.console.print(f"initial {initial_text(initial)}")

    def _left(self) -> str:
        return self.remaining.text() if self.remaining is not None else ""

    def round_started(self, r: int) -> None:
        if self.remaining is not None:
            self.remaining.round_started(r)
        self.bar.reset(self.task, r=r, rounds=self.rounds, left=self._left())  # reset replaces the fields

    def step(self, n: int = 1, examples: int = 0) -> None:
        if self.remaining is not None:
            self.remaining.step(n)
        self.bar.update(self.task, advance=n, left=self._left())

    def round_done(self, summary: dict[str, Any]) -> None:
        line = round_line(summary, self.rounds)
        if self.remaining is not None:
            self.remaining.round_done(summary)
            left = self._left() if summary.get("round", 0) < self.rounds else ""
            line += f"  {left}" if left else ""
        self.console.print(line)

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
