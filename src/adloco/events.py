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


def doc(text: str, default: Any = dataclasses.MISSING) -> Any:
    """An event's field with its doc (``metadata["doc"]``, from which the run-directory reference is
    generated) and, for a field a line may lack, its default."""
    return field(default=default, metadata={"doc": text})


def num(x: float | None) -> float | None:
    """JSON-safe float: nan and inf become None (null)."""
    return float(x) if x is not None and math.isfinite(x) else None


@dataclass
class Event:
    """One line of ``metrics.jsonl``: ``event`` names its kind (each class's ``event``), ``round`` the round
    it belongs to."""

    event: ClassVar[str] = ""
    round: int = doc("the round, counted from 1 (0: before the first round)")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the line (maps keyed by id get string keys)."""
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
#
# Every field carries its doc in ``metadata["doc"]``: the documentation's run-directory reference is
# generated from these classes, their docstrings (when the event is written) and those docs.


@dataclass
class Start(Event):
    """Written once, before round 1 (as round 0): the set-up and the initial validation."""

    event: ClassVar[str] = "start"
    parameters: int = doc("parameters of one model replica")
    workers: int = doc("workers of the run (`algorithm.workers`)")
    trainers: int = doc("trainers at the start (`algorithm.trainers`)")
    allocation: dict[int, int] = doc("the trainer each worker starts with: worker → trainer")
    task: str = doc("`causal_lm` or `classification` (`model.task`)")
    train_examples: int = doc(
        "examples of the training split (blocks of `data.seq_len` tokens, or labelled texts)"
    )
    val_examples: int = doc("examples of the validation split")
    processes: int = doc("torch.distributed processes (1 for an in-process run)")
    threads_per_process: int = doc("torch CPU threads of each process")
    val_loss: float | None = doc("validation loss before training", None)
    val_ppl: float | None = doc("validation perplexity before training (language models)", None)
    val_accuracy: float | None = doc(
        "validation accuracy before training (`model.task: classification`)", None
    )


@dataclass
class Worker(Event):
    """Written every round, one per worker: its H inner steps."""

    event: ClassVar[str] = "worker"
    worker: int = doc("the worker's id")
    trainer: int = doc("the trainer it ran for this round")
    loss: float | None = doc("mean training loss over the round's steps")
    examples: int | None = doc(
        "examples in its optimizer steps (null in the library's hooked form, `with algo:`, "
        "where adloco never sees a batch)"
    )
    probe_examples: int = doc("extra examples drawn only to probe gradient statistics")
    micro: int = doc("its micro-batch: examples in one forward and backward pass")
    accum: int = doc("micro-batches accumulated per inner step")
    effective: int = doc("examples per inner step: micro × accum")
    capped: bool = doc("the request was cut down to one micro-batch (switch mode `threshold` or `cap`)")
    finite: bool = doc("its loss and parameters were finite after its steps (if not: a `fault` event)")
    compute_s: float = doc("seconds of its inner steps")
    skipped: int = doc("fp16 steps skipped on non-finite gradients", 0)


@dataclass
class Trainer(Event):
    """Written every round, one per trainer: its batch test (ALGORITHM.md §2) after its outer step."""

    event: ClassVar[str] = "trainer"
    trainer: int = doc("the trainer's id")
    workers: list[int] = doc("its workers this round")
    request: int = doc("b this round: the request its workers ran with")
    request_next: int = doc("b next round, as its batch test decided")
    target: float | None = doc("T of the test: the batch size it asks for")
    reason: str = doc(
        "what the test did: `grew`, `kept`, `capped` (at `batch.max`), `off`, `no-statistics` "
        "or `degenerate`; `scheduled`: `batch.schedule` set the request"
    )
    loss: float | None = doc("mean training loss of its workers")
    sigma2: float | None = doc("σ̂²: the pooled per-example gradient variance")
    gbar_sq: float | None = doc("‖ḡ‖²: the squared norm of the mean gradient, estimated")
    samples: int | None = doc("gradient samples pooled")
    effective: int = doc("examples per inner step, of its first worker")
    micro: int = doc("micro-batch of its first worker")
    accum: int = doc("micro-batches accumulated per step, of its first worker")
    idle_share: float = doc(
        "1 − mean/max of its workers' compute times: the share of the round a worker waited", 0.0
    )
    examples: int | None = doc("examples in its workers' steps this round (null: unknown)", 0)
    lr: float | None = doc("its first worker's inner lr at the round's last step, multiplier included", None)
    lr_scale: float = doc("the multiplier of `batch.lr_scaling` (ALGORITHM.md §10)", 1.0)


@dataclass
class Merge(Event):
    """Written when trainers merge (ALGORITHM.md §3), after the round's trainer events."""

    event: ClassVar[str] = "merge"
    merged: list[int] = doc("the trainers merged into one")
    survivor: int = doc("the trainer that goes on (the lowest id of the merged)")
    weights: dict[int, float] = doc(
        "each merged trainer's weight in the average of θ: its request over their sum"
    )
    request: int = doc("the survivor's request (`merge.survivor_batch`)")
    trainers_alive: int = doc("trainers alive after the merge")


@dataclass
class Allocation(Event):
    """Written after a merge: the workers shared again among the trainers (ALGORITHM.md §4)."""

    event: ClassVar[str] = "allocation"
    allocation: dict[int, int] = doc("worker → trainer, after the change")
    moved: list[int] = doc("workers that received θ from another worker")
    reset: list[int] = doc("workers whose inner optimizer state was reset")


@dataclass
class Fault(Event):
    """Written when a worker's loss or parameters were not finite (``non_finite``), or a trainer had no
    finite worker (``trainer_skipped``)."""

    event: ClassVar[str] = "fault"
    trainer: int = doc("the trainer concerned")
    kind: str = doc("`non_finite` or `trainer_skipped`")
    action: str = doc("what the run did about it, in words")
    worker: int | None = doc("the worker (`non_finite` only)", None)


@dataclass
class Eval(Event):
    """Written in a round with evaluation (`eval.every`), one per trainer alive."""

    event: ClassVar[str] = "eval"
    trainer: int = doc("the trainer evaluated")
    val_loss: float | None = doc("its validation loss")
    val_ppl: float | None = doc("its validation perplexity (language models)", None)
    val_accuracy: float | None = doc("its validation accuracy (`model.task: classification`)", None)


@dataclass
class Round(Event):
    """Written every round, after its other events: the round's summary, which the progress line, the
    plots and the reports read."""

    event: ClassVar[str] = "round"
    trainers_alive: int = doc("trainers alive after the round's merge")
    requests: dict[int, int] = doc(
        "the request each trainer ran this round with (as its `trainer` event's `request`)"
    )
    allocation: dict[int, int] = doc("worker → trainer, at the round's end")
    switch_mode: str = doc("`switch.mode`")
    loss: float | None = doc("mean training loss over the workers")
    examples: int = doc("training examples read this round (probe rows included)")
    examples_total: int = doc("training examples read so far")
    bytes: int = doc("bytes counted on the wire this round")
    bytes_total: int = doc("bytes counted so far")
    communications: int = doc("communications counted this round")
    communications_total: int = doc("communications counted so far")
    round_s: float = doc("seconds of the round, evaluation included")
    train_s: float = doc("seconds of the round without evaluation")
    comm_s: float = doc("of `train_s`, seconds in counted collectives (this process's view, waits included)")
    max_compute_s: float = doc("the slowest worker's compute seconds")
    collectives: list[list[Any]] = doc(
        "[kind, op, n, payload bytes, count, workers] per counted collective, in the order "
        "issued (older runs' rows name no workers: they held every worker)"
    )
    sim_s: float = doc(
        "simulated seconds: the workers' compute and collectives on the network model (ALGORITHM.md §7)"
    )
    sim_total_s: float = doc("simulated seconds so far")
    idle_share: float = doc("mean over trainers of their idle share", 0.0)
    collectives_behind: list[list[Any]] = field(
        default_factory=list,
        metadata={
            "doc": "[kind, op, workers, payload bytes, count, share] per counted collective that ran behind "
            "a share of this round's compute (`sync.overlap`: 1; streaming: fragment_delay / inner_steps); "
            "`sim_s` prices them at what the compute did not hide"
        },
    )
    behind_s: float = doc("seconds those took on the background lane (this process's view)", 0.0)
    wait_s: float = doc("of `comm_s`, seconds the round waited for what ran behind compute", 0.0)
    val_loss: float | None = doc(
        "validation loss of trainer 0 (the lowest id alive), when this round was evaluated", None
    )
    val_ppl: float | None = doc("validation perplexity of trainer 0", None)
    val_accuracy: float | None = doc("validation accuracy of trainer 0", None)
    val_by_trainer: dict[int, dict[str, float | None]] | None = doc(
        "every evaluated trainer's `val_loss`, `val_ppl`, `val_accuracy`", None
    )
    requests_next: dict[int, int] | None = doc(
        "the next round's requests (after the batch tests and a merge)", None
    )


@dataclass
class Checkpoint(Event):
    """Written when a checkpoint is in place (written in the background while training goes on)."""

    event: ClassVar[str] = "checkpoint"
    name: str = doc("its folder under `checkpoints/`")
    bytes: int = doc("its size on disk")
    seconds: float = doc("from the start of the gather to the checkpoint in place")
    stall_s: float = doc("of those, the time training waited (gathering and copying the state)", 0.0)


@dataclass
class Membership(Event):
    """Written when the number of workers changed: an elastic restart, or a resume on another number of
    workers (ALGORITHM.md §9.2)."""

    event: ClassVar[str] = "membership"
    workers: int = doc("workers after the change")
    workers_before: int = doc("workers before it")
    left: list[int] = doc("worker ids no longer there")
    joined: list[int] = doc("worker ids new")
    merged: list[list[int]] = doc("trainers merged because fewer workers than trainers were left")
    restart_s: float | None = doc("seconds from the last progress logged before the change to training again")
    restarts: int = doc("restarts of this run so far (torchrun's restart count)")


@dataclass
class Resume(Event):
    """Written when the run continued from a checkpoint (``--resume`` or an elastic restart)."""

    event: ClassVar[str] = "resume"
    checkpoint: str = doc("the checkpoint it continued from")


@dataclass
class Summary:
    """``summary.json``, and the ``end`` event of metrics.jsonl."""

    method: str = doc("`algorithm.method`")
    rounds: int = doc("rounds completed")
    initial_val_ppl: float | None = doc(
        "validation perplexity before the first round, of the reported trainer"
    )
    final_val_ppl: float | None = doc("validation perplexity after the last round, of the reported trainer")
    final_val_loss: float | None = doc("validation loss after the last round")
    trainers_final: int = doc("trainers alive at the end")
    requests_final: dict[int, int] = doc("every trainer's request at the end, by trainer id")
    examples_total: int = doc("training examples read: optimizer steps' and probe rows")
    communications_total: int = doc("counted communications (ALGORITHM.md §7)")
    bytes_total: int = doc("bytes counted on the wire")
    bytes_by_kind: dict[str, int] = doc(
        "those bytes by what travelled: `delta`, `stats`, `probe`, `grad`, `merge`, `move` or `init`"
    )
    wall_s: float = doc("seconds of training, evaluation included (a resumed run adds the time before)")
    sim_s: float = doc("simulated seconds on the modelled network (`network.bandwidth`, `network.latency`)")
    peak_memory_bytes: int = doc("peak CUDA memory allocated, or the process's peak resident set on CPU")
    reported_trainer: int = doc(
        "the trainer whose validation the rounds and the summary report and whose model is "
        "saved: the lowest id alive"
    )
    initial_val_accuracy: float | None = doc(
        "validation accuracy before the first round (`model.task: classification` only)", None
    )
    final_val_accuracy: float | None = doc(
        "validation accuracy after the last round (`model.task: classification` only)", None
    )
    idle_share: float = doc(
        "the rounds' mean idle share: 1 − mean/max of a trainer's workers' compute times, "
        "averaged over trainers (ALGORITHM.md §9.3)",
        0.0,
    )
    restarts: int = doc(
        "restarts of the run's processes by torchrun's elastic agent and changes of its membership "
        "(a plain `--resume` is not one: it writes a `resume` event)",
        0,
    )
    rounds_lost: int = doc("rounds trained, then lost with their processes, and run again", 0)
    stopped: str | None = doc(
        "the signal that stopped the run (`SIGINT`, `SIGTERM`; its round in progress undone, the "
        "summary as of its last whole round), null when it ran to its end",
        None,
    )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``summary.json``; the accuracies only for a classification run."""
        out = _jsonable(self)
        if self.initial_val_accuracy is None and self.final_val_accuracy is None:
            del out["initial_val_accuracy"], out["final_val_accuracy"]
        return out


@dataclass
class End(Event):
    """Written once, after the last round: every key of ``summary.json`` beside ``event`` and ``round``."""

    event: ClassVar[str] = "end"
    summary: Summary = field(
        default_factory=lambda: Summary("", 0, None, None, None, 0, {}, 0, 0, 0, {}, 0, 0, 0, 0),
        metadata={"doc": "the run's summary, its keys written inline"},
    )

    def to_dict(self) -> dict[str, Any]:
        """The JSON line: ``event``, ``round`` and the summary's keys."""
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
    """The typed summary of a ``summary.json`` object (the keys it lacks take their defaults)."""
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
