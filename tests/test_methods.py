"""Methods by one key, ablations by their own sections' keys: presets resolve and run as documented."""

from __future__ import annotations

import pytest
import torch

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


def test_ddp_averages_gradients_every_step() -> None:
    assert resolve(overrides=["algorithm.method=ddp"]).algorithm.trainers == 1
    cfg = tiny_config(**{"algorithm": {"method": "ddp", "rounds": 2, "inner_steps": 3, "trainers": 1}})
    assert (cfg.batch.test, cfg.merge.policy, cfg.outer.optimizer) == ("none", "none", "average")
    c = coordinator(cfg)
    theta0 = c.theta(0).clone()
    out = c.run_round()
    params = [w.flat.param for w in c.workers.values()]
    assert all(torch.equal(p, params[0]) for p in params)  # every worker took the same steps
    assert torch.equal(c.theta(0), params[0]) and not torch.equal(c.theta(0), theta0)
    n, p = cfg.algorithm.workers, c.n_params
    # one all-reduce of P float32 values among the N workers per step, and no Δ at all
    assert out["summary"]["collectives"] == [["grad", "all_reduce", n, 4 * p, 3]]
    assert out["summary"]["bytes"] == 3 * 2 * (n - 1) * 4 * p


def test_ddp_on_one_worker_is_plain_training() -> None:
    """With one worker, ddp and diloco with outer averaging take the same steps on the same data."""
    a = coordinator(tiny_config(**{"algorithm": {"method": "ddp", "workers": 1, "trainers": 1, "rounds": 2}}))
    b = coordinator(
        tiny_config(
            **{
                "algorithm": {"method": "diloco", "workers": 1, "trainers": 1, "rounds": 2},
                "outer": {"optimizer": "average"},
            }
        )
    )
    for _ in range(2):
        a.run_round()
        b.run_round()
    assert torch.allclose(a.theta(0), b.theta(0), atol=1e-6)


def test_a_budget_of_examples_ends_the_run_early() -> None:
    from adloco.telemetry.metrics import MetricsSink
    from adloco.telemetry.progress import Progress

    cfg = tiny_config(**{"algorithm": {"rounds": 50, "budget": 100}})
    c = coordinator(cfg)
    summary = c.run(MetricsSink(), Progress())
    assert summary["examples_total"] >= 100 and summary["rounds"] < 50
    per_round = summary["examples_total"] / summary["rounds"]
    assert (
        summary["examples_total"] - per_round < 100 or summary["rounds"] == 1
    )  # stopped at the first round past it
    assert summary["sim_s"] > 0 and summary["peak_memory_bytes"] > 0
