"""Methods by one key, ablations by their own sections' keys: presets resolve and run as documented."""

from __future__ import annotations

import pytest

from adloco.config import resolve
from tests.helpers import coordinator, tiny_config


def test_presets_fill_only_what_the_user_left_unset() -> None:
    d = resolve(overrides=["algorithm.method=diloco"])
    assert (d.outer.optimizer, d.outer.lr, d.outer.momentum) == ("nesterov", 0.7, 0.9)
    assert (d.batch.test, d.merge.policy, d.algorithm.trainers, d.batch.statistics) == (
        "none",
        "none",
        1,
        False,
    )
    assert d.inner.optimizer == "adamw"
    ls = resolve(overrides=["algorithm.method=localsgd"])
    assert (ls.inner.optimizer, ls.outer.optimizer, ls.batch.test, ls.merge.policy) == (
        "sgd",
        "average",
        "none",
        "none",
    )
    # a user's key wins over the preset: DiLoCo with K independent trainers, and with the norm test
    k = resolve(overrides=["algorithm.method=diloco", "algorithm.trainers=4", "batch.test=norm"])
    assert (k.algorithm.trainers, k.batch.test, k.merge.policy) == (4, "norm", "none")


def test_diloco_runs_one_trainer_constant_batch_no_probe() -> None:
    cfg = tiny_config(**{"algorithm": {"method": "diloco", "trainers": 1, "rounds": 2}})
    c = coordinator(cfg)
    for _ in range(2):
        out = c.run_round()
        t = [e for e in out["events"] if e["event"] == "trainer"]
        assert len(t) == 1 and t[0]["reason"] == "off" and t[0]["sigma2"] is None  # no statistics taken
        assert not [e for e in out["events"] if e["event"] == "merge"]
    assert (
        c.requests == {0: 2} and c.trainers[0].outer.kind == "nesterov" and c.trainers[0].outer.v is not None
    )


def test_diloco_with_independent_trainers_never_merges() -> None:
    cfg = tiny_config(
        **{"algorithm": {"method": "diloco", "trainers": 2, "rounds": 2}, "model": {"init": "independent"}}
    )
    c = coordinator(cfg)
    assert not c.theta(0).equal(c.theta(1))  # one seed per trainer
    c.run_round()
    c.run_round()
    assert c.alive == [0, 1]


def test_localsgd_uses_sgd_inside_and_averages() -> None:
    cfg = tiny_config(**{"algorithm": {"method": "localsgd", "trainers": 1, "rounds": 1}})
    c = coordinator(cfg)
    c.run_round()
    import torch

    assert all(isinstance(w.optimizer, torch.optim.SGD) for w in c.workers.values())
    assert c.trainers[0].outer.kind == "average"


@pytest.mark.parametrize(
    ("overrides", "check"),
    [
        (
            ["batch.test=none"],
            lambda ev: all(e["reason"] == "off" and e["sigma2"] is not None for e in ev["trainer"]),
        ),
        (["merge.policy=none"], lambda ev: not ev["merge"]),
        (
            ["switch.mode=cap", "batch.initial=12"],
            lambda ev: all(e["accum"] == 1 and e["capped"] for e in ev["worker"]),
        ),
        (
            ["switch.mode=accumulate", "batch.initial=6"],
            lambda ev: all(e["accum"] == 2 for e in ev["worker"]),
        ),
    ],
)
def test_ablations(overrides: list[str], check) -> None:  # type: ignore[no-untyped-def]
    cfg = tiny_config(*overrides, **{"algorithm": {"rounds": 1}})
    out = coordinator(cfg).run_round()
    ev: dict[str, list] = {"trainer": [], "merge": [], "worker": []}
    for e in out["events"]:
        ev.setdefault(e["event"], []).append(e)
    assert check(ev)
