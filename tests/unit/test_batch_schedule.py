"""``batch.schedule`` (ALGORITHM.md §15): the rule against schedules computed by hand, the round that
follows it (the request of every round of a DiLoCo on a toy model), a resumed run that continues the
same schedule bit for bit, and the combinations refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from adloco import AdaptiveBatch, AdLoCo, DiLoCo, Merging
from adloco.library.algorithms.batch_schedule import request
from tests.toy import Data, build, run_round


@pytest.mark.parametrize(
    ("rule", "scale", "power", "expected"),
    [
        # ramp from 4 to 32 over 1,000 examples: 4 + ⌊28·D/1000⌋, then 32
        ("ramp", 1000, 0.5, {0: 4, 35: 4, 36: 5, 500: 18, 999: 31, 1000: 32, 5000: 32}),
        # power, D₀ = 1,000, p = 0.5: 4 up to D₀, then ⌊4·√(D/1000)⌋, capped at 32
        ("power", 1000, 0.5, {0: 4, 1000: 4, 2250: 6, 4000: 8, 9000: 12, 63999: 31, 64000: 32, 10**6: 32}),
        # p = 1: linear in D once past D₀
        ("power", 100, 1.0, {100: 4, 150: 6, 199: 7, 200: 8, 800: 32}),
        ("none", 1000, 0.5, {0: 4, 10**6: 4}),
    ],
)
def test_the_schedule_against_values_computed_by_hand(
    rule: str, scale: int, power: float, expected: dict[int, int]
) -> None:
    got = {d: request(rule, d, 4, 32, scale, power) for d in expected}
    assert got == expected


def test_the_schedule_never_falls_and_stays_within_its_bounds() -> None:
    for rule in ("ramp", "power"):
        seq = [request(rule, d, 3, 20, 777, 0.4) for d in range(0, 5_000_000, 997)]
        assert seq[0] == 3 and max(seq) == 20 and all(a <= b for a, b in zip(seq, seq[1:], strict=False))


def _diloco(schedule: str, scale: int = 40, **kw: Any) -> DiLoCo:
    return build(
        DiLoCo,
        inner_steps=3,
        batch=AdaptiveBatch(
            test="none", statistics=False, initial=2, max=8, schedule=schedule, schedule_examples=scale, **kw
        ),
    )


def test_each_round_runs_the_request_the_schedule_gives_for_the_examples_read() -> None:
    """2 workers x 3 steps: a round reads 6·b examples. Ramp 2 -> 8 over 40 examples, b = 2 + ⌊6·D/40⌋:
    D = 12 -> 3, 12 + 18 = 30 -> 6, 30 + 36 = 66 -> 8, then 8."""
    algo, data = _diloco("ramp"), Data()
    rows, seen = [], 0
    for _ in range(5):
        rep = run_round(algo, data)
        rows.append(rep.workers[0].examples // 3)
        seen += rep.examples
        assert rep.trainers[0].reason == "scheduled"
        assert rep.trainers[0].request_next == request("ramp", seen, 2, 8, 40, 0.5)
    assert rows == [2, 3, 6, 8, 8]
    assert algo.totals.examples == 12 + 18 + 36 + 48 + 48


def test_a_resumed_run_continues_the_same_schedule_bit_for_bit() -> None:
    data = Data()
    a = _diloco("power", scale=10, schedule_power=0.7)
    for _ in range(2):
        run_round(a, data)
    state = a.full_state_dict()
    b = _diloco("power", scale=10, schedule_power=0.7)
    b.load_state_dict(state)
    for _ in range(3):
        ra, rb = run_round(a, data), run_round(b, data)
        assert ra.trainers[0].request_next == rb.trainers[0].request_next
    assert a.requests == b.requests and a.requests[0] > 2 and a.totals.examples == b.totals.examples
    assert torch.equal(a.theta(0), b.theta(0))


def test_a_schedule_with_merging_trainers_gives_every_trainer_its_request() -> None:
    algo = build(
        AdLoCo,
        4,
        optimizer=torch.optim.SGD,
        inner_steps=2,
        trainers=4,
        batch=AdaptiveBatch(test="none", initial=2, max=6, schedule="ramp", schedule_examples=64),
        merge=Merging(every=2),
    )
    data = Data()
    seen = 0
    for _ in range(4):
        rep = run_round(algo, data)
        seen += rep.examples
        assert set(algo.requests.values()) == {request("ramp", seen, 2, 6, 64, 0.5)}


def test_a_schedule_beside_a_batch_test_is_refused() -> None:
    with pytest.raises(ValueError, match=r"batch.schedule = 'ramp': must be none with batch.test = 'norm'"):
        AdaptiveBatch(schedule="ramp")


def test_the_hooked_form_refuses_a_schedule() -> None:
    algo = _diloco("ramp")
    with pytest.raises(ValueError, match="batch.schedule = 'ramp': your loader decides the rows"), algo:
        pass
