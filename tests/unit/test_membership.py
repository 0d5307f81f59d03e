"""Membership changes (ALGORITHM.md §9.2): the pure resize, and the algorithm continuing on 2 or 6 workers from
a 4-worker state, per batch policy."""

from __future__ import annotations

import math

import pytest
import torch

from adloco import AdaptiveBatch, AdLoCo, Merging, Outer
from adloco.library.algorithms import allocation, membership
from tests.toy import Data, run_round
from tests.toy import build as toy_build


def test_fewer_workers_than_trainers_merges_by_policy_first() -> None:
    plan = membership.resize({0: 4, 1: 6, 2: 8, 3: 30}, {0: 0, 1: 1, 2: 2, 3: 3}, 2, batch="per_worker")
    # the two smallest (0, 1) merge, then (0: 6 now, 2: 8) again: 2 trainers for 2 workers
    assert [s.merged for s in plan.merges] == [[0, 1], [0, 2]]
    assert plan.merges[0].weights == {0: 0.4, 1: 0.6} and plan.merges[0].request == 6
    assert plan.requests == {0: 8, 3: 30}
    assert sorted(set(plan.allocation.values())) == [0, 3] and len(plan.allocation) == 2
    assert plan.left == [2, 3] and plan.joined == []


@pytest.mark.parametrize(("batch", "expected"), [("per_trainer", {0: 8, 1: 8}), ("per_worker", {0: 4, 1: 4})])
def test_the_batch_policy_keeps_examples_per_step_or_the_request(
    batch: str, expected: dict[int, int]
) -> None:
    """4 workers, 2 trainers of 2 workers and request 4, down to 2 workers: one each."""
    plan = membership.resize({0: 4, 1: 4}, {0: 0, 1: 0, 2: 1, 3: 1}, 2, batch=batch, cap=64)
    assert plan.requests == expected
    assert plan.allocation == {0: 0, 1: 1} and plan.kept == [0]  # worker 1 now serves trainer 1


def test_more_workers_are_shared_by_requests_and_capped() -> None:
    plan = membership.resize({0: 4, 1: 12}, {0: 0, 1: 1, 2: 1, 3: 1}, 8, batch="per_trainer", cap=16)
    counts = {t: len(ws) for t, ws in allocation.members(plan.allocation).items()}
    assert counts == allocation.shares({0: 4, 1: 12}, 8) == {0: 2, 1: 6}
    assert plan.requests == {0: 2, 1: 6}  # ⌈1·4/2⌉, ⌈3·12/6⌉
    assert plan.joined == [4, 5, 6, 7] and plan.kept == [0, 1, 2, 3]
    assert membership.resize({0: 40}, {0: 0}, 1, cap=32).requests == {0: 32}


def four_worker_state(rounds: int = 2) -> tuple[dict, AdLoCo]:
    algo = toy_build(
        AdLoCo,
        4,
        inner_steps=2,
        trainers=4,
        outer=Outer.nesterov(0.5, 0.8),
        batch=AdaptiveBatch(eta=0.3, initial=2, max=64),
        merge=Merging("smallest", every=3),
    )
    for _ in range(rounds):
        run_round(algo, Data())
    state = algo.full_state_dict()
    assert state is not None
    return state, algo


def build(n: int, batch: str = "per_trainer") -> AdLoCo:
    return toy_build(
        AdLoCo,
        n,
        seed=5,  # other weights: everything must come from the state
        inner_steps=2,
        trainers=min(4, n),
        outer=Outer.nesterov(0.5, 0.8),
        batch=AdaptiveBatch(eta=0.3, initial=2, max=64),
        merge=Merging("smallest", every=3),
        on_resize=batch,
    )


@pytest.mark.parametrize("batch", ["per_trainer", "per_worker"])
def test_a_four_worker_state_continues_on_two(batch: str) -> None:
    state, old = four_worker_state()
    reqs = old.requests
    algo = build(2, batch)
    algo.load_state_dict(state)
    plan = membership.resize(reqs, old.allocation, 2, batch=batch, cap=64)
    assert algo.requests == plan.requests and algo.allocation == plan.allocation
    assert algo.membership == {
        "workers_before": 4,
        "workers": 2,
        "left": [2, 3],
        "joined": [],
        "merged": [s.merged for s in plan.merges],
        "kept": plan.kept,
    }
    # the merged θ and outer momentum are request-weighted means of the old trainers', merge after merge
    theta = {t: old.theta(t) for t in old.alive}
    v = {t: old.trainers[t].outer.v for t in old.alive}
    for step in plan.merges:
        theta[step.survivor] = sum(step.weights[t] * theta.pop(t) for t in step.merged)
        v[step.survivor] = sum(step.weights[t] * v.pop(t) for t in step.merged)
    assert plan.merges and sorted(theta) == algo.alive
    for t in algo.alive:
        torch.testing.assert_close(algo.theta(t), theta[t])
        torch.testing.assert_close(algo.trainers[t].outer.v, v[t])
    for w, rep in algo.replicas.items():
        assert torch.equal(rep.flat.param, algo.theta(algo.allocation[w]))
        assert (len(rep.optimizer.state) > 0) == (w in plan.kept)
    run_round(algo, Data())  # and the run goes on
    assert algo.round == 3


def test_a_four_worker_state_continues_on_six() -> None:
    state, old = four_worker_state()
    algo = build(6)
    algo.load_state_dict(state)
    assert sorted(algo.allocation) == list(range(6)) and set(algo.allocation.values()) == set(old.alive)
    assert algo.membership is not None and algo.membership["joined"] == [4, 5]
    for t in old.alive:
        assert torch.equal(algo.theta(t), old.theta(t))  # no merge: θ as it was
    grown = {t: len(ws) for t, ws in algo.members().items()}
    before = {t: len(ws) for t, ws in old.members().items()}
    for t, b in old.requests.items():
        assert algo.requests[t] == min(64, math.ceil(before[t] * b / grown[t]))
    run_round(algo, Data())
    assert algo.round == 3


def test_a_state_without_every_trainer_cannot_be_resized() -> None:
    _, old = four_worker_state(1)
    partial = old.state_dict()
    del partial["trainers"][3]
    with pytest.raises(ValueError, match=r"trainer\(s\) \[3\] have none"):
        build(2).load_state_dict(partial)
