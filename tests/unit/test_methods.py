"""Methods by one key, ablations by their own sections' keys: presets resolve and run as documented."""

from __future__ import annotations

import pytest
import torch

from adloco.config import resolve
from tests.helpers import driver, run_round, tiny_config


def test_presets_fill_only_what_the_user_left_unset() -> None:
    d = resolve(overrides=["algorithm.method=diloco"])
    assert (d.outer.optimizer, d.outer.lr) == ("sgd", 0.5)  # measured best at these sizes (RESULTS)
    paper = resolve(overrides=["algorithm.method=diloco", "outer.optimizer=nesterov", "outer.lr=0.7"])
    assert (paper.outer.optimizer, paper.outer.lr, paper.outer.momentum) == ("nesterov", 0.7, 0.9)
    assert (d.batch.test, d.merge.policy, d.algorithm.trainers, d.batch.statistics) == (
        "none",
        "none",
        1,
        False,
    )
    assert d.inner.optimizer == "auto"  # the default's: DiLoCo's preset leaves the inner optimizer alone
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
    c = driver(cfg)
    for _ in range(2):
        out = run_round(c)
        t = [e for e in out["events"] if e["event"] == "trainer"]
        assert len(t) == 1 and t[0]["reason"] == "off" and t[0]["sigma2"] is None  # no statistics taken
        assert not [e for e in out["events"] if e["event"] == "merge"]
    assert (
        c.algo.requests == {0: 2}
        and c.algo.trainers[0].outer.kind == "sgd"
        and c.algo.trainers[0].outer.v is None  # no momentum kept
    )


def test_diloco_with_independent_trainers_never_merges() -> None:
    cfg = tiny_config(
        **{"algorithm": {"method": "diloco", "trainers": 2, "rounds": 2}, "model": {"init": "independent"}}
    )
    c = driver(cfg)
    assert not c.algo.theta(0).equal(c.algo.theta(1))  # one seed per trainer
    run_round(c)
    run_round(c)
    assert c.algo.alive == [0, 1]


def test_localsgd_uses_sgd_inside_and_averages() -> None:
    cfg = tiny_config(**{"algorithm": {"method": "localsgd", "trainers": 1, "rounds": 1}})
    c = driver(cfg)
    run_round(c)
    import torch

    assert all(isinstance(w.optimizer, torch.optim.SGD) for w in c.algo.replicas.values())
    assert all(g["momentum"] == 0.0 for w in c.algo.replicas.values() for g in w.optimizer.param_groups)
    assert c.algo.trainers[0].outer.kind == "average"


def test_rounds_report_trainer_0_not_the_best_of_several() -> None:
    """Two independent DiLoCo trainers: the round reports trainer 0's validation even when trainer 1's
    is lower (choosing the best on the reported split would flatter multi-trainer runs)."""
    cfg = tiny_config(
        **{
            "algorithm": {"method": "diloco", "trainers": 2, "workers": 2, "rounds": 2},
            "model": {"init": "independent"},
        }
    )
    c = driver(cfg)
    for _ in range(2):
        out = run_round(c)
        evals = {e["trainer"]: e["val_loss"] for e in out["events"] if e["event"] == "eval"}
        assert evals[0] != evals[1]
        assert out["summary"]["val_loss"] == evals[0]


def test_extra_probe_examples_count_toward_examples_and_the_budget() -> None:
    """A request of 1 draws an extra probe batch (k single examples): they are training data read."""
    cfg = tiny_config(**{"algorithm": {"trainers": 1, "workers": 2, "rounds": 1}, "batch": {"initial": 1}})
    c = driver(cfg)
    out = run_round(c)
    workers = [e for e in out["events"] if e["event"] == "worker"]
    assert all(e["probe_examples"] == 8 and e["examples"] == 2 for e in workers)  # k = 8, H = 2 steps of 1
    assert out["summary"]["examples"] == c.algo.totals.examples == 2 * (8 + 2)


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
    out = run_round(driver(cfg))
    ev: dict[str, list] = {"trainer": [], "merge": [], "worker": []}
    for e in out["events"]:
        ev.setdefault(e["event"], []).append(e)
    assert check(ev)


def test_ddp_averages_gradients_every_step() -> None:
    assert resolve(overrides=["algorithm.method=ddp"]).algorithm.trainers == 1
    cfg = tiny_config(**{"algorithm": {"method": "ddp", "rounds": 2, "inner_steps": 3, "trainers": 1}})
    assert (cfg.batch.test, cfg.merge.policy, cfg.outer.optimizer) == ("none", "none", "average")
    c = driver(cfg)
    theta0 = c.algo.theta(0).clone()
    out = run_round(c)
    params = [w.flat.param for w in c.algo.replicas.values()]
    assert all(torch.equal(p, params[0]) for p in params)  # every worker took the same steps
    assert torch.equal(c.algo.theta(0), params[0]) and not torch.equal(c.algo.theta(0), theta0)
    n, p = cfg.algorithm.workers, c.n_params
    # one all-reduce of P float32 values among the N workers per step, and no Δ at all
    assert out["summary"]["collectives"] == [["grad", "all_reduce", n, 4 * p, 3, list(range(n))]]
    assert out["summary"]["bytes"] == 3 * 2 * (n - 1) * 4 * p


def test_ddp_on_one_worker_is_plain_training() -> None:
    """With one worker, ddp and diloco with outer averaging take the same steps on the same data."""
    a = driver(tiny_config(**{"algorithm": {"method": "ddp", "workers": 1, "trainers": 1, "rounds": 2}}))
    b = driver(
        tiny_config(
            **{
                "algorithm": {"method": "diloco", "workers": 1, "trainers": 1, "rounds": 2},
                "outer": {"optimizer": "average"},
            }
        )
    )
    for _ in range(2):
        run_round(a)
        run_round(b)
    assert torch.allclose(a.algo.theta(0), b.algo.theta(0), atol=1e-6)


def test_a_budget_of_examples_ends_the_run_early() -> None:
    from adloco.telemetry.metrics import MetricsSink
    from adloco.telemetry.progress import Progress

    cfg = tiny_config(**{"algorithm": {"rounds": 50, "budget": 100}})
    c = driver(cfg)
    summary = c.run(MetricsSink(), Progress()).to_dict()
    assert summary["examples_total"] >= 100 and summary["rounds"] < 50
    per_round = summary["examples_total"] / summary["rounds"]
    assert (
        summary["examples_total"] - per_round < 100 or summary["rounds"] == 1
    )  # stopped at the first round past it
    assert summary["sim_s"] > 0 and summary["peak_memory_bytes"] > 0


def test_a_budget_reached_between_evaluations_still_evaluates_the_last_round() -> None:
    """The last round that runs is always evaluated: with eval.every = 2 and a budget reached in round 3,
    the final perplexity is round 3's, and the best trainer is one that is still alive (merges every 3)."""
    from adloco.telemetry.metrics import MetricsSink
    from adloco.telemetry.progress import Progress

    class Keep(MetricsSink):
        def __init__(self) -> None:
            self.events: list[dict] = []

        def log(self, event: dict) -> None:
            self.events.append(event)

    cfg = tiny_config(
        **{
            "algorithm": {"rounds": 10, "trainers": 4, "workers": 4, "inner_steps": 2},
            "batch": {"initial": 2, "test": "none", "statistics": False},
            "eval": {"every": 2},
            "merge": {"every": 3},
        }
    )
    per_round = 4 * 2 * 2  # workers x H x batch
    cfg = cfg.replace(algorithm={"budget": 2 * per_round + 1})  # reached in round 3
    c = driver(cfg)
    sink = Keep()
    summary = c.run(sink, Progress())
    rounds = [e for e in sink.events if e["event"] == "round"]
    assert [e["round"] for e in rounds] == [1, 2, 3]
    assert [e["val_ppl"] is not None for e in rounds] == [False, True, True]
    assert summary.final_val_ppl == rounds[-1]["val_ppl"]
    assert summary.reported_trainer == 0 and len(c.algo.alive) == 3  # the merge of round 3 happened
    assert c.trainer_state_dict(summary.reported_trainer) is not None  # the saved model is a live trainer's
