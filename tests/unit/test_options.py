"""The round's dials as one object (:class:`adloco.library.options.RoundOptions`): the algorithm objects take it or
its fields as keywords, the same either way; ``adloco train`` builds it from the config keys its fields
name, so a new dial is a field there and its config field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn

from adloco import AdaptiveBatch, AdLoCo, DiLoCo, LocalSGD, Outer, RoundOptions, Wire
from adloco.config import Config, resolve
from adloco.engine.build import round_options
from adloco.library.options import config_key


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return ((model(x).squeeze(-1) - y) ** 2).mean()


def replicas(n: int) -> tuple[list[nn.Linear], list[torch.optim.Optimizer]]:
    torch.manual_seed(0)
    ms = [nn.Linear(3, 1) for _ in range(n)]
    return ms, [torch.optim.SGD(m.parameters(), lr=0.1) for m in ms]


def test_options_or_keywords_build_the_same_algorithm() -> None:
    dials: dict[str, Any] = dict(
        inner_steps=3, trainers=1, outer=Outer.nesterov(0.5), clip=0.5, balance="speed"
    )
    by_keywords = AdLoCo(*replicas(2), loss_fn=loss_fn, **dials)
    by_options = AdLoCo(*replicas(2), loss_fn=loss_fn, options=RoundOptions(**dials))
    assert by_keywords.options == by_options.options
    assert (by_options.H, len(by_options.trainers), by_options.clip, by_options.balance) == (
        3,
        1,
        0.5,
        "speed",
    )
    assert by_options.outer_spec == Outer.nesterov(0.5)


def test_a_dial_left_unset_is_the_methods_and_one_set_is_kept() -> None:
    opts = RoundOptions(inner_steps=2)
    assert opts.trainers is None and opts.outer is None  # the method decides
    diloco = DiLoCo(*replicas(2), loss_fn=loss_fn, options=opts)
    assert len(diloco.trainers) == 1 and diloco.outer_spec == Outer.sgd(0.5)
    assert diloco.batch.test == "none" and diloco.merging.policy == "none"
    adloco = AdLoCo(*replicas(2), loss_fn=loss_fn, options=opts.replace(trainers=2))
    assert len(adloco.trainers) == 2 and adloco.outer_spec == Outer() and adloco.batch == AdaptiveBatch()
    kept = LocalSGD(*replicas(2), loss_fn=loss_fn, options=opts.replace(outer=Outer.sgd(0.3), trainers=2))
    assert kept.outer_spec == Outer.sgd(0.3) and len(kept.trainers) == 2
    assert RoundOptions(wire=Wire("int8")).for_method("diloco").wire == Wire("int8")


def test_diloco_takes_batch_size_beside_options() -> None:
    algo = DiLoCo(*replicas(1), loss_fn=loss_fn, batch_size=5, options=RoundOptions(inner_steps=2))
    assert (algo.batch.initial, algo.stated_batch, algo.H) == (5, 5, 2)
    with pytest.raises(ValueError, match="batch_size: give batch_size or batch=AdaptiveBatch"):
        DiLoCo(*replicas(1), loss_fn=loss_fn, batch_size=5, options=RoundOptions(batch=AdaptiveBatch()))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"options": RoundOptions(), "inner_steps": 2},
            ValueError,
            "options: given with inner_steps as keywords",
        ),
        ({"options": {"inner_steps": 2}}, ValueError, "options: expected a RoundOptions"),
        ({"inner_step": 2}, TypeError, "AdLoCo.. got an unexpected keyword argument 'inner_step'"),
        ({"snapshot": "yes"}, ValueError, "snapshot = 'yes': must be True or False"),
        ({"clip": float("nan")}, ValueError, "clip = nan: must be >= 0"),
    ],
)
def test_bad_options_are_refused_in_one_line(kwargs: dict[str, Any], error: type, message: str) -> None:
    given = kwargs if "options" in kwargs else {"trainers": 1, **kwargs}
    with pytest.raises(error, match=message):
        AdLoCo(*replicas(1), loss_fn=loss_fn, **given)


def test_every_option_with_a_config_key_reads_it_with_the_same_default() -> None:
    """A field that names a config key is read from it as it is: the key exists, and the library's default
    is the config's (a whole section: None, the method's preset, of the section's class)."""
    cfg, named = Config(), 0
    for f in dataclasses.fields(RoundOptions):
        key = config_key(f.name)
        if key is None:
            continue
        named += 1
        section, _, name = key.partition(".")
        value = getattr(getattr(cfg, section), name) if name else getattr(cfg, section)
        if name:
            assert value == f.default, f.name
        else:
            assert f.default is None and type(value).__name__ in f.type, f.name  # type: ignore[operator]
    assert named >= 10


def test_the_engine_builds_the_options_from_the_config_keys() -> None:
    cfg = resolve(
        overrides=[
            "algorithm.inner_steps=6",
            "inner.clip=0.25",
            "inner.state=reset",
            "runtime.balance=speed",
            "elastic.batch=per_worker",
            "outer.optimizer=sgd",
            "comm.dtype=int8",
        ]
    )
    derived: dict[str, Any] = dict(
        trainers=1,
        switch=cfg.switch,
        fixed_rows=0.0,
        emulate_speed=None,
        snapshot=True,
        sync_initial=False,
        cuda_graphs=False,
    )
    opts = round_options(cfg, **derived)
    assert (opts.inner_steps, opts.clip, opts.inner_state, opts.balance) == (6, 0.25, "reset", "speed")
    assert (opts.on_resize, opts.outer, opts.wire) == ("per_worker", cfg.outer, cfg.comm)
    assert (opts.snapshot, opts.sync_initial, opts.trainers) == (True, False, 1)
    del derived["snapshot"]
    with pytest.raises(TypeError, match="RoundOptions.snapshot has no config key"):
        round_options(cfg, **derived)
