"""One declaration per dial: the library objects built with no arguments carry exactly the settings
``adloco train`` resolves for the same method, and every field of the config has one type, default,
range and doc (the library's dial classes are the config's sections)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from adloco import AdaptiveBatch, Merging, Outer, Switch, Wire
from adloco.config import SECTION_TYPES, Config, resolve
from adloco.library.baselines import METHOD_CLASSES
from adloco.library.fields import Dial
from adloco.library.settings import METHODS


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
