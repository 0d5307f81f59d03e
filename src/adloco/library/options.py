"""The round's dials as one frozen object: everything an algorithm object takes beside your model, its
inner optimizer, the communicator and the loss (ALGORITHM.md §6).

:class:`RoundOptions` is declared once, here. :class:`adloco.AdLoCo` and its presets take it
(``options=RoundOptions(...)``) or its fields as keywords (``AdLoCo(model, opt, inner_steps=10)``: the
signature :func:`signature` spells out, so ``help()`` and the API reference list every one);
``adloco train`` builds it from its config, each field reading the key its metadata names
(:func:`config_key`). A new dial is a field here and, for ``adloco train``, its config field.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from adloco.library.fields import check_clip, check_round, choice, dial
from adloco.library.presets import PRESETS, outer_note, preset
from adloco.library.settings import (
    AdaptiveBatch,
    Balance,
    InnerState,
    Merging,
    OnResize,
    Outer,
    Precision,
    Switch,
    Sync,
    Wire,
)

__all__ = ["RoundOptions", "config_key", "method_trainers", "signature"]

log = logging.getLogger("adloco")


def config_key(name: str) -> str | None:
    """The ``adloco train`` config key a :class:`RoundOptions` field is read from as it is (``section.key``,
    or a whole ``section`` for a dial; its ``metadata["config"]``); None where the application derives it."""
    return next(f.metadata["config"] for f in dataclasses.fields(RoundOptions) if f.name == name)


@dataclass(frozen=True)
class RoundOptions:
    """The dials of an algorithm object's rounds, checked at construction (``ValueError`` naming the field
    and what is allowed). A dial left None is the method's: its preset (:data:`adloco.library.presets.PRESETS`),
    which :meth:`for_method` fills in.

    Args:
        inner_steps: H, optimizer steps per round (DDP: a reporting period only; gradients are averaged
            every step).
        trainers: K0, model instances at start, each with at least one worker (None: the method's, 4 for
            AdLoCo and 1 for DiLoCo, LocalSGD and DDP).
        outer: the outer step (:class:`~adloco.library.settings.Outer`; None: the method's, averaging for AdLoCo,
            LocalSGD and DDP, DiLoCo's SGD at lr 0.5 without momentum (measured best at these sizes; the
            paper's Nesterov 0.7/0.9 is ``Outer.nesterov()``); with a codec that brings its own step, that
            one (topk: SparseLoCo's SGD at lr 1, no momentum), said in one log line).
        batch, merge, switch, wire, sync: the dials (:mod:`adloco.library.settings`), each the config section of
            the same name (``wire`` is ``comm``); None: the method's (AdLoCo: the sections' defaults; the
            presets: a constant batch, no merging, ``accumulate`` so a constant batch is never capped to
            b_max). ``switch.b_max`` is every local worker's largest micro-batch (``set_b_max`` sets one per
            worker); ``wire`` is what Δ travels as (dtype, blocks, error feedback), ``sync`` when (overlap,
            streaming fragments).
        clip: inner gradient clipping (global norm; 0 turns it off).
        precision: fp32, or bf16 / fp16 autocast on CUDA (fp16 with dynamic loss scaling).
        inner_state: keep (DiLoCo) or reset the inner optimizer every round (the reference).
        balance: equal gives every worker of a trainer its request b (bit for bit reproducible); speed
            shares each trainer's M·b examples per step by measured speed, and workers among trainers by
            capacity (ALGORITHM.md §9.3): faster on uneven devices, but the run depends on timings.
        fixed_rows: a forward and backward pass's fixed cost, in rows (α/β of a step-time profile,
            ALGORITHM.md §11; ``adloco train`` derives it from ``runtime.profile``). With balance speed,
            speeds are measured net of it and rows shared so that every worker's step takes the same time;
            0: a step costs its rows alone.
        emulate_speed: one factor in (0, 1] per worker (all of them, by id): worker w takes 1/s_w as long
            per step (it sleeps the difference): heterogeneous devices emulated on identical hardware.
        on_resize: loading the state of a run with another number of workers (ALGORITHM.md §9.2):
            per_trainer keeps each trainer's examples per step (b re-derived from M·b), per_worker keeps b.
        snapshot: keep the inner state at each round's start in host memory, so an aborted round is
            undone in place (``adloco train`` uses it to stop on a signal).
        sync_initial: broadcast each trainer's θ from its first worker to the others at construction
            (counted as ``init``); pass False when every process built identical replicas.
        cuda_graphs: each worker's inner step a CUDA graph replayed on its own stream, so a process's
            workers train at once on their GPU (ALGORITHM.md §14); needs a capturable inner optimizer
            (``AdamW(..., capturable=True, fused=True)``); not with DDP, fp16 or the hooked form.
    """

    TRAINERS: ClassVar[int] = 4  # K0 where the method's preset does not set it (AdLoCo)

    # metadata["config"]: the adloco train key read as it is; None: the application derives the value
    # (trainers: algorithm.trainers, at most the workers; switch: its section with b_max found; fixed_rows:
    # runtime.profile; emulate_speed: runtime.emulate_speed, one per worker; cuda_graphs: auto resolved)
    inner_steps: int = field(default=12, metadata={"config": "algorithm.inner_steps"})
    trainers: int | None = field(default=None, metadata={"config": None})
    outer: Outer | None = field(default=None, metadata={"config": "outer"})
    batch: AdaptiveBatch | None = field(default=None, metadata={"config": "batch"})
    merge: Merging | None = field(default=None, metadata={"config": "merge"})
    switch: Switch | None = field(default=None, metadata={"config": None})
    wire: Wire | None = field(default=None, metadata={"config": "comm"})
    sync: Sync | None = field(default=None, metadata={"config": "sync"})
    clip: float = field(default=1.0, metadata={"config": "inner.clip"})
    precision: Precision = field(default="fp32", metadata={"config": "model.precision"})
    inner_state: InnerState = field(default="keep", metadata={"config": "inner.state"})
    balance: Balance = field(default="equal", metadata={"config": "runtime.balance"})
    fixed_rows: float = field(default=0.0, metadata={"config": None})
    emulate_speed: Sequence[float] | None = field(default=None, metadata={"config": None})
    on_resize: OnResize = field(default="per_trainer", metadata={"config": "elastic.batch"})
    snapshot: bool = field(default=False, metadata={"config": None})
    sync_initial: bool = field(default=True, metadata={"config": None})
    cuda_graphs: bool = field(default=False, metadata={"config": None})

    def __post_init__(self) -> None:
        check_round(self.inner_steps, self.fixed_rows)
        check_clip(self.clip)
        choice("precision", self.precision, Precision)
        choice("inner_state", self.inner_state, InnerState)
        choice("balance", self.balance, Balance)
        choice("on_resize", self.on_resize, OnResize)
        dials: tuple[tuple[str, type], ...] = (
            ("outer", Outer),
            ("batch", AdaptiveBatch),
            ("merge", Merging),
            ("switch", Switch),
            ("wire", Wire),
            ("sync", Sync),
        )
        for name, cls in dials:
            if getattr(self, name) is not None:
                dial(name, getattr(self, name), cls)
        for name in ("snapshot", "sync_initial", "cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} = {getattr(self, name)!r}: must be True or False")

    def replace(self, **changes: Any) -> RoundOptions:
        """A copy with ``changes``, checked like the original."""
        return dataclasses.replace(self, **changes)

    def for_method(self, method: str) -> RoundOptions:
        """These options as ``method`` runs them: every dial left None takes the method's preset
        (:func:`adloco.library.presets.preset`); the outer step the preset gives way to (a codec's own:
        :func:`adloco.library.presets.preset_values`) is said in one log line. A dial
        that is set is never replaced."""
        wire = self.wire if self.wire is not None else Wire()
        outer = self.outer
        if outer is None:
            outer = preset(method, Outer, wire.dtype)
            if (note := outer_note(method, outer, wire)) is not None:
                log.info(note)
        return self.replace(
            trainers=self.trainers if self.trainers is not None else method_trainers(method),
            outer=outer,
            batch=self.batch if self.batch is not None else preset(method, AdaptiveBatch),
            merge=self.merge if self.merge is not None else preset(method, Merging),
            switch=self.switch if self.switch is not None else preset(method, Switch),
            wire=wire,
            sync=self.sync if self.sync is not None else Sync(),
        )

    @classmethod
    def given(cls, options: RoundOptions | None, dials: dict[str, Any], owner: str) -> RoundOptions:
        """An algorithm object's options: ``options``, or its keyword arguments ``dials`` (not both); a
        keyword that is no field is Python's ``TypeError``, naming it and ``owner``."""
        names = [f.name for f in dataclasses.fields(cls)]
        for name in dials:
            if name not in names:
                raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
        if options is None:
            return cls(**dials)
        if not isinstance(options, cls):
            raise ValueError(f"options: expected a RoundOptions(...) from adloco, got {options!r}")
        if dials:
            raise ValueError(
                f"options: given with {', '.join(sorted(dials))} as keywords; give the dials one way "
                "(options.replace(...) changes some)"
            )
        return options


def method_trainers(method: str) -> int:
    """K0 of ``method`` where the trainers are left unset: its preset's, else :attr:`RoundOptions.TRAINERS`."""
    return int(PRESETS[method].get("algorithm", {}).get("trainers", RoundOptions.TRAINERS))


def signature(init: Callable[..., Any], method: str) -> inspect.Signature:
    """``init``'s signature without ``self``, its ``**dials`` spelled out: every :class:`RoundOptions` field,
    keyword-only, with its default (``trainers``: ``method``'s K0, :func:`method_trainers`). What ``help()``
    and the API reference show."""
    names = {f.name for f in dataclasses.fields(RoundOptions)}
    own = [p for p in inspect.signature(init).parameters.values() if p.name != "self" and p.name not in names]
    trainers = method_trainers(method)
    dials = [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=trainers if f.name == "trainers" else f.default,
            annotation="int" if f.name == "trainers" else f.type,
        )
        for f in dataclasses.fields(RoundOptions)
    ]
    params = [p for p in own if p.kind is not inspect.Parameter.VAR_KEYWORD] + dials
    return inspect.Signature(params, return_annotation=inspect.Signature.empty)
