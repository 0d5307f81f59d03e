"""Declaring a config field once, and checking a value against it: the machinery under
:mod:`adloco.library.settings`' dials and :mod:`adloco.config`'s application sections.

:func:`setting` declares a field (default, allowed range, one-line doc); :func:`conform` checks and
converts a value to its type, naming ``section.key``, the value and what is allowed; :class:`Dial` is a
section's frozen dataclass, checked on construction; :func:`dial` and :func:`choice` check a library
argument.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import importlib
import math
import numbers
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

# --------------------------------------------------------------------------------------------------
# Declaring a field, and checking one
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Range:
    """Bounds of a number (each element, for a list), worded from the bounds (``>= 1``, ``> 0``,
    ``in [0, 1)``) with the ``unit`` after them, or by ``allowed`` where that phrasing says too little."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    allowed: str = ""
    unit: str = ""

    def ok(self, x: float) -> bool:
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return False
        return not (self.hi is not None and (x >= self.hi if self.hi_open else x > self.hi))

    def text(self, nullable: bool = False) -> str:
        """The allowed values in words; ``nullable``: the field also takes null, said unless ``allowed``
        says it."""
        words = self.allowed or self._bounds() + (f" ({self.unit})" if self.unit else "")
        return words + " or null" if nullable and "null" not in words else words

    def _bounds(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        assert self.hi is not None
        return f"{'<' if self.hi_open else '<='} {_num(self.hi)}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def setting(
    default: Any,
    doc: str,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    allowed: str = "",
    unit: str = "",
) -> Any:
    """A dataclass field with its one-line doc and, for a number, its range (``at_least``/``above`` a lower
    bound, ``at_most``/``below`` an upper one) as messages word it: from the bounds, with ``unit`` after
    them and "or null" where the type takes None, or as ``allowed`` says."""
    rng = None
    if any(b is not None for b in (at_least, above, at_most, below)) or allowed:
        rng = Range(
            lo=above if above is not None else at_least,
            hi=below if below is not None else at_most,
            lo_open=above is not None,
            hi_open=below is not None,
            allowed=allowed,
            unit=unit,
        )
    meta = {"doc": doc, "range": rng}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def describe(tp: Any) -> str:
    """What a value of type ``tp`` must be, in words ('an integer', "one of 'a', 'b'")."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        words = typing.get_args(tp)
        return repr(words[0]) if len(words) == 1 else "one of " + ", ".join(repr(a) for a in words)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        null = " or null" if type(None) in typing.get_args(tp) else ""
        return " or ".join(describe(a) for a in args) + null
    if origin is collections.abc.Callable:
        return "a callable (in the library)"
    if origin is list:
        (inner,) = typing.get_args(tp)
        return f"a list of {describe(inner)}s"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


_BOOL_WORDS = {False: {"off", "no", "false"}, True: {"on", "yes", "true"}}


def conform(value: Any, tp: Any, lenient: bool = False) -> Any:
    """``value`` as type ``tp``, or raise ValueError. Strict (a dial built in code): an int is a float,
    nothing else converts. ``lenient`` (a value read from YAML or ``--set``): also ``2.0`` as the int 2,
    ``4e-3`` (YAML 1.1 reads it as a string without a dot) as a number, and YAML's off/on/no/yes booleans
    as the one choice they spell."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if lenient and isinstance(value, bool):
            spelled = [a for a in typing.get_args(tp) if str(a).lower() in _BOOL_WORDS[value]]
            if len(spelled) == 1:
                return spelled[0]
        if value in typing.get_args(tp) and not isinstance(value, bool):
            return value
        raise ValueError
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            try:
                return conform(value, arg, lenient)
            except ValueError:
                continue
        raise ValueError
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ValueError
        return [conform(v, inner, lenient) for v in value]
    if origin is collections.abc.Callable:  # the library's own objects; a config file names choices only
        if callable(value) and not lenient:
            return value
        raise ValueError
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ValueError
    if tp is int:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
        if lenient and isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError
    if tp is float:
        if lenient and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ValueError from None
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        raise ValueError
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError
    raise TypeError(f"unsupported setting type {tp}")


class Dial:
    """Base of every dial and config section: ``__post_init__`` checks each field's type and range, then
    the rules between fields (:meth:`check`). Subclasses are frozen dataclasses with ``SECTION`` set."""

    SECTION: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            where = f"{self.SECTION}.{f.name} = {value!r}"
            try:
                value = conform(value, hints[f.name])
            except ValueError:
                raise ValueError(f"{where}: must be {describe(hints[f.name])}") from None
            rng: Range | None = f.metadata.get("range")
            if rng is not None and value is not None:
                values = value if isinstance(value, list) else [value]
                if not all(rng.ok(x) for x in values):
                    raise ValueError(
                        f"{where}: must be {rng.text(type(None) in typing.get_args(hints[f.name]))}"
                    )
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Rules between this dial's fields (a subclass's); raise ValueError naming the field."""

    def need(self, ok: bool, key: str, allowed: str) -> None:
        """Raise ValueError ``section.key = value: must be allowed`` unless ``ok``."""
        if not ok:
            raise ValueError(f"{self.SECTION}.{key} = {getattr(self, key)!r}: must be {allowed}")

    @classmethod
    def docs(cls) -> list[tuple[str, Any, str]]:
        """(key, default, doc) of every field, in declaration order; a choice's doc begins with its allowed
        values (``(norm | inner_product | ...)``)."""
        hints = typing.get_type_hints(cls)
        out = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            doc = f.metadata.get("doc", "")
            choices = _choices(hints[f.name])
            if choices:
                doc = f"({' | '.join(map(str, choices))}) {doc}"
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc,operator]
            out.append((f.name, default, doc))
        return out


D = typing.TypeVar("D", bound=Dial)


def _choices(tp: Any) -> tuple[Any, ...]:
    """The words a field of type ``tp`` takes in a config (its ``Literal``'s, or its union's ``Literal``'s)."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        words = tuple(a for arg in args for a in _choices(arg))
        return words + ("true", "false") if words and bool in args else words  # auto, true or false
    return ()


# A callable named in a config: ``package.module:function`` (as entry points and uvicorn's APP name them)
NAMED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def load_named(name: str) -> Callable[..., Any]:
    """The callable that ``name`` (``module:function``, :data:`NAMED`) names, imported as Python imports it
    (the installed packages and ``PYTHONPATH``; then, where that fails, also the current folder, last on
    the path, as uvicorn and gunicorn do); ValueError saying in words why it cannot be had: a module that
    does not import (and what it raised), a missing attribute, something not callable."""
    module, _, attr = name.partition(":")
    try:
        obj: Any = _import(module)
    except Exception as exc:  # a module's own code may raise anything while it imports
        raise ValueError(
            f"module {module!r} does not import ({type(exc).__name__}: {exc}); it is looked for in the "
            "installed packages, PYTHONPATH and the current folder"
        ) from None
    where = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ValueError(f"{where!r} has no attribute {part!r}{hint}")
        obj, where = getattr(obj, part), f"{where}.{part}"
    if not callable(obj):
        raise ValueError(f"{where} is a {type(obj).__name__}, not a callable")
    return cast("Callable[..., Any]", obj)


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        searched = here in sys.path or "" in sys.path  # "": the current folder, as `python -m` puts it
        if searched or exc.name is None or not module.startswith(exc.name):
            raise  # not found anywhere, or found and failing on an import of its own
        sys.path.append(here)
        return importlib.import_module(module)


def check_speeds(speeds: Sequence[float], workers: int, name: str = "runtime.emulate_speed") -> list[float]:
    """``runtime.emulate_speed``: empty, or one factor in (0, 1] per worker (worker w takes 1/s_w as long per
    step). The one check of it, for the library (``name``: its argument) and the config."""
    values = list(speeds)
    if values and (
        len(values) != workers
        or not all(isinstance(x, numbers.Real) and not isinstance(x, bool) and 0 < x <= 1 for x in values)
    ):
        raise ValueError(
            f"{name} = {values!r}: must be empty or {workers} numbers in (0, 1] "
            "(one per worker: 0.5 takes twice as long)"
        )
    return [float(x) for x in values]


def check_round(inner_steps: Any, fixed_rows: Any) -> None:
    """The plain arguments of an algorithm object that are numbers: H and a pass's fixed cost in rows."""
    if not isinstance(inner_steps, int) or isinstance(inner_steps, bool) or inner_steps < 1:
        raise ValueError(f"inner_steps = {inner_steps!r}: must be an integer >= 1 (H counts optimizer steps)")
    if not (isinstance(fixed_rows, int | float) and math.isfinite(fixed_rows) and fixed_rows >= 0):
        raise ValueError(f"fixed_rows = {fixed_rows!r}: must be a finite number >= 0 (rows)")


def check_clip(clip: Any) -> None:
    """Inner gradient clipping: a global norm >= 0 (0 turns it off)."""
    if not isinstance(clip, (int, float)) or isinstance(clip, bool) or clip < 0 or not math.isfinite(clip):
        raise ValueError(f"clip = {clip!r}: must be >= 0 (0 turns clipping off)")


def check_trainers(trainers: Any, workers: int) -> None:
    """K₀ in [1, N]: every trainer needs a worker."""
    if not isinstance(trainers, int) or not 1 <= trainers <= workers:
        raise ValueError(
            f"trainers = {trainers!r}: must be an integer in [1, {workers}]: every trainer needs a worker (pass "
            "a list of models for several workers in one process, or run one process per worker)"
        )


def dial(name: str, value: Any, cls: type[D]) -> D:
    """An algorithm object's dial argument: the dataclass itself (None: its defaults)."""
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise ValueError(f"{name}: expected an {cls.__name__}(...) from adloco, got {value!r}")
    return value


def choice(name: str, value: Any, tp: Any) -> None:
    """A plain argument's value among the ``Literal`` ``tp``'s (the same words as the config's)."""
    if value not in typing.get_args(tp):
        raise ValueError(f"{name} = {value!r}: must be {describe(tp)}")
