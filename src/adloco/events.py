"""One typed schema for everything a run records: written by the engine, read by progress, plots,
``adloco report`` and ``adloco bench``.

Each event is a dataclass with a class-level ``event`` name; ``to_dict`` gives the JSON line of
``metrics.jsonl`` (maps keyed by worker or trainer id get string keys, as JSON requires) and
:func:`parse` reads one back into its dataclass (unknown events and unknown keys are kept loosely, so a
newer file still reads). Field names are the run directory's contract: renaming one is a breaking change.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar


def num(x: float | None) -> float | None:
    """JSON-safe float: nan and inf become None (null)."""
    return float(x) if x is not None and math.isfinite(x) else None


@dataclass
class Event:
    event: ClassVar[str] = ""
    round: int

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"event": self.event}
        for f in dataclasses.fields(self):
            out[f.name] = _jsonable(getattr(self, f.name))
        return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
    return v


# -- the events, in the order a round writes them ------------------------------------------------------


@dataclass
class Start(Event):
    """Before the first round: the set-up and the initial validation metrics."""

    event: ClassVar[str] = "start"
    parameters: int
    workers: int
    trainers: int
    allocation: dict[int, int]  # worker -> trainer
    task: str
    train_examples: int
    val_examples: int
    processes: int
    threads_per_process: int
    val_loss: float | None = None
    val_ppl: float | None = None
    val_accuracy: float | None = None


@dataclass
class Worker(Event):
    """One worker's round: its H inner steps."""

    event: ClassVar[str] = "worker"
    worker: int
    trainer: int
    loss: float | None  # mean training loss over the round's steps
    examples: int | None  # examples in optimizer steps (None: the hooked form, rows never seen)
    probe_examples: int  # extra examples drawn only to probe gradient statistics
    micro: int
    accum: int
    effective: int  # examples per inner step: micro x accum
    capped: bool  # the request was cut down to one micro-batch (switch mode threshold or cap)
    finite: bool
    compute_s: float
    skipped: int = 0  # fp16 steps skipped on non-finite gradients


@dataclass
class Trainer(Event):
    """One trainer's batch test (ALGORITHM.md §2) after its outer step."""

    event: ClassVar[str] = "trainer"
    trainer: int
    workers: list[int]
    request: int  # b this round
    request_next: int  # b next round
    target: float | None  # T of the test
    reason: str  # grew | kept | capped | off | no-statistics | degenerate
    loss: float | None
    sigma2: float | None  # pooled per-example gradient variance
    gbar_sq: float | None  # ‖ḡ‖²
    samples: int | None  # gradient samples pooled
    effective: int  # of its first worker
    micro: int
    accum: int
    idle_share: float = 0.0  # 1 − mean/max of its workers' compute times: the share a worker waited
    examples: int | None = 0  # examples in its workers' steps this round (None: unknown)


@dataclass
class Merge(Event):
    event: ClassVar[str] = "merge"
    merged: list[int]
    survivor: int
    weights: dict[int, float]
    request: int
    trainers_alive: int


@dataclass
class Allocation(Event):
    event: ClassVar[str] = "allocation"
    allocation: dict[int, int]  # worker -> trainer, after the change
    moved: list[int]  # workers that received θ from another worker
    reset: list[int]  # workers whose inner optimizer state was reset


@dataclass
class Fault(Event):
    event: ClassVar[str] = "fault"
    trainer: int
    kind: str  # non_finite | trainer_skipped
    action: str
    worker: int | None = None


@dataclass
class Eval(Event):
    event: ClassVar[str] = "eval"
    trainer: int
    val_loss: float | None
    val_ppl: float | None = None
    val_accuracy: float | None = None


@dataclass
class Round(Event):
    """The round's summary: what the progress line, the plots and the reports read."""

    event: ClassVar[str] = "round"
    trainers_alive: int  # after the round's merge
    requests: dict[int, int]  # the request each trainer ran this round with (as its trainer event's)
    allocation: dict[int, int]
    switch_mode: str
    loss: float | None
    examples: int
    examples_total: int
    bytes: int
    bytes_total: int
    communications: int
    communications_total: int
    round_s: float  # with evaluation
    train_s: float  # without evaluation
    comm_s: float  # of train_s, in counted collectives (this process's view, waits included)
    max_compute_s: float
    collectives: list[list[Any]]  # [kind, op, workers, payload bytes, count]: counted ones only
    sim_s: float  # simulated: slowest worker's compute + the network model (ALGORITHM.md §7)
    sim_total_s: float
    idle_share: float = 0.0  # mean over trainers of their idle share
    val_loss: float | None = None  # of trainer 0 (the lowest id alive), when this round was evaluated
    val_ppl: float | None = None
    val_accuracy: float | None = None
    val_by_trainer: dict[int, dict[str, float | None]] | None = None
    requests_next: dict[int, int] | None = None  # the next round's (after the batch tests and a merge)


@dataclass
class Checkpoint(Event):
    event: ClassVar[str] = "checkpoint"
    name: str
    bytes: int
    seconds: float  # from the start of the gather to the checkpoint in place
    stall_s: float = 0.0  # of those, the time training waited (gathering and copying the state)


@dataclass
class Membership(Event):
    """The number of workers changed (an elastic restart, or a resume with another number of workers)."""

    event: ClassVar[str] = "membership"
    workers: int  # after the change
    workers_before: int
    left: list[int]  # worker ids no longer there
    joined: list[int]  # worker ids new
    merged: list[list[int]]  # trainers merged because fewer workers than trainers were left
    restart_s: float | None  # seconds from the last progress logged before the change to training again
    restarts: int  # restarts of this run so far (torchrun's restart count)


@dataclass
class Resume(Event):
    event: ClassVar[str] = "resume"
    checkpoint: str


@dataclass
class Summary:
    """``summary.json``, and the ``end`` event of metrics.jsonl."""

    method: str
    rounds: int
    initial_val_ppl: float | None
    final_val_ppl: float | None
    final_val_loss: float | None
    trainers_final: int
    requests_final: dict[int, int]
    examples_total: int
    communications_total: int
    bytes_total: int
    bytes_by_kind: dict[str, int]
    wall_s: float
    sim_s: float
    peak_memory_bytes: int
    reported_trainer: int  # whose validation the summary and the rounds report, and whose model is saved
    initial_val_accuracy: float | None = None
    final_val_accuracy: float | None = None
    idle_share: float = 0.0  # the rounds' mean idle share
    restarts: int = 0  # times the run was restarted (elastic restarts and resumes)
    rounds_lost: int = 0  # rounds run again after restarts (trained, then lost with their process)

    def to_dict(self) -> dict[str, Any]:
        out = _jsonable(self)
        if self.initial_val_accuracy is None and self.final_val_accuracy is None:
            del out["initial_val_accuracy"], out["final_val_accuracy"]
        return out


@dataclass
class End(Event):
    event: ClassVar[str] = "end"
    summary: Summary = field(
        default_factory=lambda: Summary("", 0, None, None, None, 0, {}, 0, 0, 0, {}, 0, 0, 0, 0)
    )

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "round": self.round, **self.summary.to_dict()}


EVENTS: dict[str, type[Event]] = {
    c.event: c
    for c in (
        Start,
        Worker,
        Trainer,
        Merge,
        Allocation,
        Fault,
        Eval,
        Round,
        Checkpoint,
        Membership,
        Resume,
        End,
    )
}


# -- reading ----------------------------------------------------------------------------------------


def _int_keyed(tp: Any) -> bool:
    return typing.get_origin(tp) is dict and typing.get_args(tp)[:1] == (int,)


def _build(cls: type, d: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        v = d[f.name]
        tp = hints[f.name]
        if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
            inner = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = inner[0] if len(inner) == 1 else tp
        if v is not None and _int_keyed(tp):
            v = {int(k): x for k, x in v.items()}
        kw[f.name] = v
    return cls(**kw)


def parse(d: dict[str, Any]) -> Event | dict[str, Any]:
    """The typed event of one JSON line (an unknown event stays a dict)."""
    cls = EVENTS.get(str(d.get("event")))
    if cls is None:
        return d
    if cls is End:
        return End(int(d.get("round", 0)), _build(Summary, d))
    return _build(cls, d)


def summary_from_dict(d: dict[str, Any]) -> Summary:
    return typing.cast(Summary, _build(Summary, d))


def read(path: Path) -> list[Event]:
    """The typed events of a metrics.jsonl; a torn last line (a killed run) and unknown events are
    skipped."""
    out: list[Event] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            e = parse(json.loads(line))
        except (json.JSONDecodeError, TypeError, ValueError):
            continue
        if isinstance(e, Event):
            out.append(e)
    return out


E = typing.TypeVar("E", bound=Event)


def of(events: list[Event], kind: type[E]) -> list[E]:
    """The events of one type, in file order."""
    return [e for e in events if isinstance(e, kind)]
