"""Switch mode (ALGORITHM.md §5): micro-batch, accumulation and cap from the request b and b_max."""

from __future__ import annotations

import math
import random

import pytest

from adloco.library.algorithms.switch import Plan, mode_for, plan


@pytest.mark.parametrize(
    ("b", "expected"),
    [
        (1, Plan(1, 1, False)),
        (5, Plan(5, 1, False)),
        (8, Plan(8, 1, False)),
        (9, Plan(8, 1, True)),  # b_max < b <= κ b_max: one micro-batch, the request is capped
        (16, Plan(8, 1, True)),  # b == κ b_max is still "no accumulation"
        (17, Plan(8, 3, False)),  # b > κ b_max: accumulate ⌈17/8⌉ = 3
        (24, Plan(8, 3, False)),
        (25, Plan(8, 4, False)),
    ],
)
def test_threshold(b: int, expected: Plan) -> None:
    assert plan(b, 8, "threshold", 2.0) == expected


def test_threshold_other_kappa() -> None:
    assert plan(20, 8, "threshold", 3.0) == Plan(8, 1, True)
    assert plan(25, 8, "threshold", 3.0) == Plan(8, 4, False)
    assert plan(9, 8, "threshold", 1.0) == Plan(8, 2, False)
    assert plan(12, 8, "threshold", 1.5) == Plan(8, 1, True)
    assert plan(13, 8, "threshold", 1.5) == Plan(8, 2, False)


@pytest.mark.parametrize(
    ("b", "expected"),
    [
        (1, Plan(1, 1, False)),
        (8, Plan(8, 1, False)),
        (9, Plan(8, 2, False)),
        (16, Plan(8, 2, False)),
        (17, Plan(8, 3, False)),
    ],
)
def test_accumulate(b: int, expected: Plan) -> None:
    assert plan(b, 8, "accumulate", 2.0) == expected


@pytest.mark.parametrize(
    ("b", "expected"),
    [(3, Plan(3, 1, False)), (8, Plan(8, 1, False)), (9, Plan(8, 1, True)), (100, Plan(8, 1, True))],
)
def test_cap(b: int, expected: Plan) -> None:
    assert plan(b, 8, "cap", 2.0) == expected


def test_effective() -> None:
    assert Plan(8, 3, False).effective == 24
    assert plan(17, 8, "threshold", 2.0).effective == 24
    assert plan(12, 8, "threshold", 2.0).effective == 8
    assert plan(12, 8, "accumulate", 2.0).effective == 16


def test_plan_invariants_random_sweep() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        b, b_max, kappa = rng.randint(1, 500), rng.randint(1, 64), rng.choice([1.0, 1.5, 2.0, 3.0])
        for mode in ("threshold", "accumulate", "cap"):
            p = plan(b, b_max, mode, kappa)
            assert 1 <= p.micro <= b_max
            assert p.accum >= 1
            if p.capped:
                assert p.accum == 1 and p.micro == b_max < b
            else:
                assert b <= p.effective < b + p.micro  # no more than one partly wasted micro-batch
            if mode == "cap":
                assert p.accum == 1
            if mode == "accumulate":
                assert not p.capped and p.accum == math.ceil(b / b_max)
            if mode == "threshold":
                assert (p.accum > 1) == (b > kappa * b_max and b > b_max)


@pytest.mark.parametrize(("b", "b_max"), [(0, 8), (-1, 8), (4, 0)])
def test_invalid_input(b: int, b_max: int) -> None:
    with pytest.raises(ValueError):
        plan(b, b_max, "threshold", 2.0)


def test_unknown_mode() -> None:
    with pytest.raises(ValueError):
        plan(4, 8, "sometimes", 2.0)


def test_mode_for() -> None:
    for mode in ("threshold", "accumulate", "cap"):
        assert mode_for("fixed", mode, 4) == mode
        assert mode_for("fixed", mode, 1) == mode
    assert mode_for("reference", "cap", 4) == "accumulate"
    assert mode_for("reference", "cap", 2) == "accumulate"
    assert mode_for("reference", "cap", 1) == "threshold"
    with pytest.raises(ValueError):
        mode_for("adaptive", "threshold", 2)
