"""What each method fixes (ALGORITHM.md §6), section by section, and the dials it gives: the library's
DiLoCo, LocalSGD and DDP take their defaults from :data:`PRESETS`, and ``adloco train`` fills what a
config leaves unset from the same table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adloco.library.fields import D
from adloco.library.settings import METHODS, Outer, Wire, codec_rules

# :mod:`adloco.config` adds LocalSGD's inner SGD, which only the application builds.
_ONE_TRAINER_CONSTANT_BATCH: dict[str, dict[str, Any]] = {
    "algorithm": {"trainers": 1},
    "batch": {"test": "none", "statistics": False},
    "merge": {"policy": "none"},
    "switch": {"mode": "accumulate"},  # a constant batch is honoured: never capped to b_max
}
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "adloco": {},
    # DiLoCo's outer step: SGD at lr 0.5 without momentum, measured best at these sizes and worker counts
    # (benchmarks/RESULTS.md, "DiLoCo's outer step"); the paper's Nesterov 0.7/0.9 is outer.optimizer nesterov
    "diloco": {**_ONE_TRAINER_CONSTANT_BATCH, "outer": {"optimizer": "sgd", "lr": 0.5}},
    "localsgd": {**_ONE_TRAINER_CONSTANT_BATCH, "outer": {"optimizer": "average"}},
    "ddp": {**_ONE_TRAINER_CONSTANT_BATCH, "outer": {"optimizer": "average"}},
}
assert set(PRESETS) == set(METHODS)


def preset_values(
    method: str,
    section: str,
    table: Mapping[str, Mapping[str, Any]] | None = None,
    dtype: str = "float32",
) -> dict[str, Any]:
    """What ``method`` fixes in ``section`` (``table``: default :data:`PRESETS`) under ``comm.dtype`` =
    ``dtype``. A preset outer step that steps Δ (DiLoCo's ``sgd``) gives way to the outer step the codec
    brings (:attr:`adloco.library.comm.codecs.Codec.outer`: topk, SparseLoCo's plain descent at lr 1, whose decaying
    error feedback plays the momentum's part). Whoever sets ``outer.optimizer`` or ``outer.momentum`` keeps
    the preset (:func:`outer_note` says which step a run took and why). No preset keeps a momentum, so none
    is unstable under ``sync.overlap`` delayed (:meth:`Outer.stale_momentum`)."""
    values = dict((PRESETS if table is None else table)[method].get(section, {}))
    if section == Outer.SECTION and values.get("optimizer") in ("sgd", "nesterov"):
        own = codec_rules(dtype)
        if own is not None and own.outer:
            values = {**{k: v for k, v in values.items() if k not in own.outer}, **own.outer}
    return values


def _step(values: Mapping[str, Any]) -> str:
    """An outer step as words: 'sgd at lr 0.5', 'Nesterov at lr 0.7, momentum 0.9'."""
    d = Outer()
    name, lr = values.get("optimizer", d.optimizer), values.get("lr", d.lr)
    if name == "nesterov":
        return f"Nesterov at lr {lr:g}, momentum {values.get('momentum', d.momentum):g}"
    return f"{name} at lr {lr:g}" if name == "sgd" else str(name)


def outer_note(method: str, outer: Outer, wire: Wire) -> str | None:
    """One line saying why the outer step in effect is not ``method``'s preset, where it took the codec's
    own (:func:`preset_values`); None where it is the preset or what the user asked for."""
    preset = dict(PRESETS[method].get(Outer.SECTION, {}))
    if preset.get("optimizer") not in ("sgd", "nesterov") or outer.optimizer != "sgd":
        return None
    own = codec_rules(wire.dtype)
    if own is None or own.outer.get("optimizer") != "sgd" or outer.lr != own.outer.get("lr", outer.lr):
        return None  # the preset, or an lr the user chose
    return (
        f"outer step: sgd at lr {outer.lr:g}, no momentum, in place of {method}'s {_step(preset)}: comm.dtype "
        f"{wire.dtype} brings {own.outer_why} (set outer.optimizer or outer.momentum to choose)"
    )


def preset(method: str, cls: type[D], dtype: str = "float32", **changes: Any) -> D:
    """The dial ``cls`` as ``method`` sets it (its preset over the field defaults, :func:`preset_values`
    under ``comm.dtype`` = ``dtype``), with ``changes``."""
    return cls(**{**preset_values(method, cls.SECTION, dtype=dtype), **changes})
