"""One declaration per dial: the library objects built with no arguments carry exactly the settings
``adloco train`` resolves for the same method, and every field of the config has one type, default,
range and doc (the library's dial classes are the config's sections)."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch
from torch import nn

from adloco import AdaptiveBatch, Merging, Outer, Switch, Wire
from adloco.config import SECTION_TYPES, Config, resolve
from adloco.library.baselines import METHOD_CLASSES
from adloco.library.fields import Dial, Range
from adloco.library.settings import METHODS
from adloco.plan.command import SimulateConfig


def _algo(method: str, workers: int):  # type: ignore[no-untyped-def]
    ms = [nn.Linear(3, 1) for _ in range(workers)]
    return METHOD_CLASSES[method](ms, [torch.optim.SGD(m.parameters(), lr=0.1) for m in ms])


@pytest.mark.parametrize("method", METHODS)
def test_a_library_object_built_with_no_arguments_has_the_clis_defaults(method: str) -> None:
    cfg = resolve(overrides=[f"algorithm.method={method}"])
    algo = _algo(method, cfg.algorithm.workers)
    assert cfg.algorithm.inner_steps == algo.H
    assert len(algo.trainers) == cfg.algorithm.trainers
    assert algo.outer_spec == cfg.outer
    assert algo.batch == cfg.batch
    assert algo.merging == cfg.merge
    assert algo.wire == cfg.comm
    switch = {f.name: getattr(cfg.switch, f.name) for f in dataclasses.fields(Switch)}
    assert algo.switch == Switch(**switch)
    assert (algo.clip, algo.inner_state, algo.precision) == (
        cfg.inner.clip,
        cfg.inner.state,
        cfg.model.precision,
    )
    assert (algo.balance, algo.on_resize) == (cfg.runtime.balance, cfg.elastic.batch)
    assert (algo.emulate or []) == cfg.runtime.emulate_speed
    assert algo.ddp == (method == "ddp")


def test_the_algorithm_sections_are_the_library_dials() -> None:
    assert SECTION_TYPES["outer"] is Outer and SECTION_TYPES["batch"] is AdaptiveBatch
    assert SECTION_TYPES["merge"] is Merging and SECTION_TYPES["comm"] is Wire
    assert issubclass(SECTION_TYPES["switch"], Switch)
    for name, cls in SECTION_TYPES.items():
        assert issubclass(cls, Dial) and name == cls.SECTION
        for key, _default, doc in cls.docs():
            assert doc.strip(), f"{name}.{key} has no doc"


@pytest.mark.parametrize("section", list(SECTION_TYPES))
def test_every_default_passes_its_own_checks_and_round_trips_through_the_config(section: str) -> None:
    cls = SECTION_TYPES[section]
    built = cls()  # the defaults satisfy their own ranges
    assert getattr(Config(), section) == built
    assert resolve(base={section: dataclasses.asdict(built)}) == resolve()


def test_a_dial_checks_types_strictly_and_converts_integers_to_floats() -> None:
    assert Outer(lr=1).lr == 1.0 and isinstance(Outer(lr=1).lr, float)
    with pytest.raises(ValueError, match=r"batch.initial = True: must be an integer"):
        AdaptiveBatch(initial=True)
    with pytest.raises(ValueError, match=r"outer.lr = nan: must be a number"):
        Outer(lr=float("nan"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        Outer().lr = 2.0  # type: ignore[misc]


def test_a_range_is_worded_from_its_bounds_with_its_unit_and_null_where_the_field_takes_it() -> None:
    assert Range(lo=0, lo_open=True, unit="seconds").text() == "> 0 (seconds)"
    assert Range(lo=0, lo_open=True, unit="seconds").text(nullable=True) == "> 0 (seconds) or null"
    assert Range(lo=0, hi=1).text(nullable=True) == "in [0, 1] or null"
    assert Range(lo=1, allowed="between 1 and 1000").text() == "between 1 and 1000"


@pytest.mark.parametrize("section", [*SECTION_TYPES, "simulate"])
def test_every_out_of_range_message_says_null_where_null_is_allowed(section: str) -> None:
    cls = SimulateConfig if section == "simulate" else SECTION_TYPES[section]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        rng = f.metadata.get("range")
        if rng is None or type(None) not in typing.get_args(hints[f.name]):
            continue
        wrong = (rng.lo - 1) if rng.lo is not None else (rng.hi + 1)
        if int in typing.get_args(hints[f.name]):
            wrong = int(wrong)
        with pytest.raises(ValueError, match=r"or null$") as e:
            cls(**{f.name: wrong})
        assert f"{section}.{f.name} = " in str(e.value)
