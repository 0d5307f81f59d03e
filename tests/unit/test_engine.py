"""The engine against the recording communicator: collectives, bytes, merges, allocation invariants."""

from __future__ import annotations

import math

import pytest
import torch

from adloco.library.algorithms import allocation
from adloco.library.comm.base import wire_bytes
from tests.helpers import driver, run_round, synthetic_data, tiny_config


def set_requests(c, requests: dict[int, int]) -> None:  # type: ignore[no-untyped-def]
    for t, b in requests.items():
        c.algo.trainers[t].request = b


class Recording:
    """Wraps the comm so every round's records survive the coordinator's drain."""

    def __init__(self, comm) -> None:  # type: ignore[no-untyped-def]
        self.rounds: list[list] = []
        self._drain = comm.drain

        def drain():  # type: ignore[no-untyped-def]
            recs = self._drain()
            self.rounds.append(recs)
            return recs

        comm.drain = drain


def test_delta_all_reduce_per_trainer_and_bytes() -> None:
    cfg = tiny_config(
        **{"merge": {"policy": "none"}, "algorithm": {"trainers": 2, "workers": 4, "rounds": 2}}
    )
    c = driver(cfg)
    rec = Recording(c.comm)
    P = c.n_params
    for _ in range(2):
        run_round(c)
    for recs in rec.rounds:
        deltas = [r for r in recs if r.kind == "delta"]
        assert len(deltas) == 2  # one all-reduce of Δ per trainer
        for r in deltas:
            assert r.op == "all_reduce" and r.workers == 2 and r.payload == 4 * P
            assert r.wire == 2 * (2 - 1) * 4 * P
        assert not [r for r in recs if r.kind in ("merge", "move")]
    assert c.algo.totals.bytes == sum(r.wire for recs in rec.rounds for r in recs)


def test_single_worker_trainers_communicate_no_parameters() -> None:
    cfg = tiny_config(**{"merge": {"policy": "none"}, "algorithm": {"rounds": 1}})
    c = driver(cfg)
    rec = Recording(c.comm)
    run_round(c)
    (recs,) = rec.rounds
    deltas = [r for r in recs if r.kind == "delta"]
    assert len(deltas) == 4 and all(r.wire == 0 and r.workers == 1 for r in deltas)


def test_merges_every_f_rounds_down_to_one_trainer() -> None:
    cfg = tiny_config(**{"algorithm": {"rounds": 4, "trainers": 4, "workers": 4}, "merge": {"every": 1}})
    c = driver(cfg)
    alive = []
    for _ in range(4):
        out = run_round(c)
        merges = [e for e in out["events"] if e["event"] == "merge"]
        alive.append(len(c.algo.alive))
        # allocation invariants after every round
        members = allocation.members(c.algo.allocation)
        assert set(members) == set(c.algo.alive)
        assert all(len(ws) >= 1 for ws in members.values())
        assert sorted(c.algo.allocation) == list(range(4))
        if len(alive) <= 3:
            assert len(merges) == 1
    assert alive == [3, 2, 1, 1]


def test_merge_is_batch_weighted_and_moves_workers() -> None:
    cfg = tiny_config(
        **{
            "algorithm": {"rounds": 1, "trainers": 2, "workers": 3},
            "merge": {"every": 1},
            "batch": {"test": "none"},
            "outer": {"optimizer": "sgd", "lr": 0.5},
        }
    )
    c = driver(cfg)
    rec = Recording(c.comm)
    set_requests(c, {0: 2, 1: 6})
    # θ after the outer step is needed to check the merge: capture it inside the round
    captured = {}
    orig = c.algo._maybe_merge

    def spy(members):  # type: ignore[no-untyped-def]
        captured.update({t: tr.theta.clone() for t, tr in c.algo.trainers.items()})
        captured["req"] = dict(c.algo.requests)
        return orig(members)

    c.algo._maybe_merge = spy
    out = run_round(c)
    merge = next(e for e in out["events"] if e["event"] == "merge")
    assert merge["merged"] == [0, 1] and merge["survivor"] == 0
    b0, b1 = captured["req"][0], captured["req"][1]
    expected = (b0 * captured[0] + b1 * captured[1]) / (b0 + b1)
    torch.testing.assert_close(c.algo.theta(0), expected)
    assert c.algo.requests == {0: max(b0, b1)}
    (recs,) = rec.rounds
    merges = [r for r in recs if r.kind == "merge"]
    assert len(merges) == 1 and merges[0].workers == 3  # θ only: sgd keeps no momentum
    # every worker now holds the survivor's θ
    for w in c.algo.replicas.values():
        torch.testing.assert_close(w.flat.param, c.algo.theta(0))


def test_nesterov_momentum_is_merged_too() -> None:
    cfg = tiny_config(
        "algorithm.rounds=1",
        "algorithm.trainers=2",
        "algorithm.workers=2",
        "batch.test=none",
        "outer.optimizer=nesterov",
    )
    c = driver(cfg)
    rec = Recording(c.comm)
    run_round(c)
    merges = [r for r in rec.rounds[0] if r.kind == "merge"]
    assert len(merges) == 2  # θ and momentum
    assert c.algo.trainers[0].outer.v is not None and torch.isfinite(c.algo.trainers[0].outer.v).all()


def test_moved_worker_gets_theta_and_fresh_optimizer() -> None:
    # 3 trainers over 5 workers; merging two small ones frees workers that move to the big one
    cfg = tiny_config(
        "algorithm.rounds=1",
        "algorithm.trainers=3",
        "algorithm.workers=5",
        "batch.test=none",
        "outer.optimizer=sgd",
    )
    c = driver(cfg)
    rec = Recording(c.comm)
    set_requests(c, {0: 2, 1: 2, 2: 12})
    out = run_round(c)
    alloc_ev = next(e for e in out["events"] if e["event"] == "allocation")
    counts = {t: len(ws) for t, ws in allocation.members(c.algo.allocation).items()}
    assert counts == allocation.shares({0: 2, 2: 12}, 5)
    moves = [r for r in rec.rounds[0] if r.kind == "move"]
    assert len(moves) == len(alloc_ev["moved"]) >= 1
    for x in alloc_ev["reset"]:
        assert len(c.algo.replicas[x].optimizer.state) == 0
    for w, t in c.algo.allocation.items():
        torch.testing.assert_close(c.algo.replicas[w].flat.param, c.algo.theta(t))


def test_outer_step_average_equals_mean_of_workers() -> None:
    cfg = tiny_config(
        **{
            "algorithm": {"rounds": 1, "trainers": 1, "workers": 3},
            "outer": {"optimizer": "average"},
            "merge": {"policy": "none"},
        }
    )
    c = driver(cfg)
    captured = {}
    orig = c.comm.reduce

    def spy(parts, workers, kind, *args, **kwargs):  # type: ignore[no-untyped-def]
        if kind == "delta":
            captured["mean"] = torch.stack([c.algo.replicas[w].flat.param.clone() for w in workers]).mean(0)
        return orig(parts, workers, kind, *args, **kwargs)

    c.comm.reduce = spy
    run_round(c)
    torch.testing.assert_close(c.algo.theta(0), captured["mean"], rtol=1e-6, atol=1e-7)


def test_requests_grow_only_and_examples_counted() -> None:
    cfg = tiny_config(
        **{
            "algorithm": {"rounds": 3, "trainers": 2, "workers": 2},
            "merge": {"policy": "none"},
            "batch": {"eta": 0.3},
        }
    )
    c = driver(cfg)
    prev = dict(c.algo.requests)
    total = 0
    for _ in range(3):
        out = run_round(c)
        for t, b in c.algo.requests.items():
            assert b >= prev[t]
        prev = dict(c.algo.requests)
        total += sum(e["examples"] for e in out["events"] if e["event"] == "worker")
    assert c.algo.totals.examples == total
    assert max(c.algo.requests.values()) > 2  # with η = 0.3 the tiny model's noisy gradients ask for more


@pytest.mark.parametrize("test", ["inner_product", "augmented_inner_product"])
def test_inner_product_tests_share_the_mean_probe_gradient(test: str) -> None:
    cfg = tiny_config(
        **{
            "algorithm": {"rounds": 1, "trainers": 1, "workers": 2},
            "merge": {"policy": "none"},
            "batch": {"test": test},
        }
    )
    c = driver(cfg)
    rec = Recording(c.comm)
    out = run_round(c)
    probes = [r for r in rec.rounds[0] if r.kind == "probe"]
    assert len(probes) == 1 and probes[0].payload == 4 * c.n_params
    ev = next(e for e in out["events"] if e["event"] == "trainer")
    assert ev["target"] is not None and math.isfinite(ev["target"])


def test_norm_test_default_sends_no_gradient() -> None:
    cfg = tiny_config(
        **{"algorithm": {"rounds": 1, "trainers": 1, "workers": 2}, "merge": {"policy": "none"}}
    )
    c = driver(cfg)
    rec = Recording(c.comm)
    run_round(c)
    assert not [r for r in rec.rounds[0] if r.kind == "probe"]


def test_paper_estimator_needs_two_workers() -> None:
    cfg = tiny_config(
        **{
            "algorithm": {"rounds": 1, "trainers": 2, "workers": 3},
            "merge": {"policy": "none"},
            "batch": {"estimator": "paper", "eta": 0.1},
        }
    )
    c = driver(cfg)
    out = run_round(c)
    reasons = {
        e["trainer"]: (e["reason"], len(e["workers"])) for e in out["events"] if e["event"] == "trainer"
    }
    # the one-worker trainer cannot estimate a variance from one last gradient
    assert reasons[1] == ("no-statistics", 1)
    assert reasons[0][0] in ("grew", "kept", "capped") and reasons[0][1] == 2


def test_inner_state_persists_across_rounds_unless_reset() -> None:
    cfg = tiny_config(
        "inner.optimizer=adamw",  # AdamW's step counts tell the rounds apart
        **{"algorithm": {"rounds": 2, "trainers": 1, "workers": 1}, "merge": {"policy": "none"}},
    )
    c = driver(cfg)
    run_round(c)
    run_round(c)
    opt = c.algo.replicas[0].optimizer
    steps = [s["step"] for s in opt.state.values()]
    assert all(float(s) == 4 for s in steps)  # 2 rounds x H = 2
    cfg = tiny_config(
        **{
            "algorithm": {"rounds": 2, "trainers": 1, "workers": 1},
            "merge": {"policy": "none"},
            "inner": {"state": "reset", "optimizer": "adamw"},
        }
    )
    c = driver(cfg)
    run_round(c)
    run_round(c)
    assert all(float(s["step"]) == 2 for s in c.algo.replicas[0].optimizer.state.values())


def test_worker_models_are_never_recreated() -> None:
    cfg = tiny_config(**{"algorithm": {"rounds": 3, "trainers": 4, "workers": 4}})
    c = driver(cfg)
    ids = {w: (id(x.model), x.flat.param.data_ptr()) for w, x in c.algo.replicas.items()}
    for _ in range(3):
        run_round(c)
    assert ids == {w: (id(x.model), x.flat.param.data_ptr()) for w, x in c.algo.replicas.items()}


def test_same_seed_same_trajectory() -> None:
    cfg = tiny_config(**{"algorithm": {"rounds": 2}})
    data = synthetic_data()
    a, b = driver(cfg, data), driver(cfg, data)
    for _ in range(2):
        run_round(a)
        run_round(b)
    assert a.algo.requests == b.algo.requests and a.algo.allocation == b.algo.allocation
    for t in a.algo.trainers:
        assert torch.equal(a.algo.theta(t), b.algo.theta(t))


def test_dropout_is_seeded_by_the_run_not_by_what_ran_before() -> None:
    """Imports and model loading may leave the process's generators anywhere; dropout must not care."""

    def worker_losses() -> list[float]:
        torch.seed()  # a random state, as a library that reseeds on import would leave it
        d = driver(tiny_config(**{"algorithm": {"rounds": 1}}))
        for rep in d.algo.replicas.values():
            for m in rep.model.modules():
                if hasattr(m, "attention_dropout"):
                    m.attention_dropout = 0.5
        return [e["loss"] for e in run_round(d)["events"] if e["event"] == "worker"]

    assert worker_losses() == worker_losses()


def test_wire_model() -> None:
    assert wire_bytes("all_reduce", 1, 100) == 0
    assert wire_bytes("all_reduce", 4, 100) == 600
    assert wire_bytes("broadcast", 3, 100) == 200
    assert wire_bytes("all_gather", 3, 8) == 48


def test_your_own_loop_gives_adloco_trains_parameters_bit_for_bit() -> None:
    """The same config through the public API in a loop written here (data shards, schedule and all)
    and through the driver of `adloco train`: the same parameters, bit for bit, in one process."""
    import copy

    from adloco import AdaptiveBatch, AdLoCo, Merging, Outer, Switch
    from adloco.data.sampling import ShardStream, trainer_subset
    from adloco.engine.inner import lr_at, make_optimizer
    from adloco.library.flat import flatten
    from tests.helpers import build_fn

    cfg = tiny_config(
        **{
            "algorithm": {"rounds": 3, "trainers": 2, "workers": 3},
            "merge": {"every": 2},
            "batch": {"eta": 0.3},
        }
    )
    data = synthetic_data()
    d = driver(cfg, data)
    for _ in range(3):
        run_round(d)

    a, b, i = cfg.algorithm, cfg.batch, cfg.inner
    proto = build_fn(data, cfg).build(a.seed)
    models = [copy.deepcopy(proto) for _ in range(a.workers)]
    algo = AdLoCo(
        models,
        [make_optimizer(flatten(m), i) for m in models],
        inner_steps=a.inner_steps,
        trainers=a.trainers,
        outer=Outer(cfg.outer.optimizer, cfg.outer.lr, cfg.outer.momentum),
        batch=AdaptiveBatch(b.test, b.initial, b.max, b.eta, b.vartheta, b.nu, b.estimator, b.probe_chunks),
        merge=Merging(cfg.merge.policy, cfg.merge.every),
        switch=Switch(cfg.switch.mode, cfg.switch.kappa, b_max=cfg.switch.b_max),
        clip=i.clip,
    )
    subsets = {t: trainer_subset(data.n_train, 1.0, a.seed, t) for t in range(a.trainers)}
    for r in range(3):
        streams = {
            w: ShardStream(subsets[p.trainer], a.seed, p.trainer, r, p.index, p.of)
            for w, p in algo.plans.items()
        }
        for h in range(a.inner_steps):
            for m in algo.replicas.values():
                for g in m.optimizer.param_groups:
                    g["lr"] = lr_at(r * a.inner_steps + h, a.rounds * a.inner_steps, i)
            algo.step_all({w: data.train_batch(streams[w].take(algo.batch_size(w))) for w in streams})
    assert algo.requests == d.algo.requests and algo.allocation == d.algo.allocation
    for t in algo.alive:
        assert torch.equal(algo.theta(t), d.algo.theta(t))
    assert (
        algo.totals.bytes == d.algo.totals.bytes + algo.totals.by_kind["init"]
    )  # the library syncs θ at start


def test_a_norm_test_at_eta_one_says_at_the_start_that_the_batch_cannot_grow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """batch.eta >= 1 with the norm test: one line at the start says the requests stay where they start
    (ALGORITHM.md §2.5), and they do; below 1 nothing is said and they grow."""
    import logging

    def requests(eta: float, initial: int) -> tuple[set[int], str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="adloco"):
            cfg = tiny_config(
                algorithm={"rounds": 3, "trainers": 1, "workers": 2},
                batch={"eta": eta, "initial": initial, "max": 64},
                switch={"b_max": 64},
                merge={"policy": "none"},
            )
            c = driver(cfg)
            said = " ".join(r.getMessage() for r in caplog.records if "batch.eta" in r.getMessage())
            seen = {
                e[k]
                for _ in range(3)
                for e in run_round(c)["events"]
                if e["event"] == "trainer"
                for k in ("request", "request_next")
            }
        return seen, said

    seen, said = requests(1.0, 8)
    assert seen == {8}
    assert said.startswith("batch.eta 1 with the norm test: the test's target is bounded by")
    assert "the batch stays at batch.initial (8) all run; η below 1 lets it grow" in said
    seen, said = requests(1.0, 1)
    assert max(seen) <= 8 and "or reaches 8 at most where a step has one row" in said
    seen, said = requests(0.3, 8)
    assert said == "" and max(seen) > 8
