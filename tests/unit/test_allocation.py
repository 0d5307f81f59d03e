"""Workers -> trainers (ALGORITHM.md §4): largest-remainder shares, at least one worker each, minimal moves.

The property tests are seeded random sweeps (hypothesis is not a dependency of this project).
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from adloco.library.algorithms.allocation import allocate, members, shares

# ---------------------------------------------------------------------------------------------------
# shares
# ---------------------------------------------------------------------------------------------------


def test_shares_proportional_exact() -> None:
    assert shares({0: 8, 1: 4, 2: 4}, 8) == {0: 4, 1: 2, 2: 2}
    assert shares({0: 1, 1: 3}, 8) == {0: 2, 1: 6}


def test_shares_largest_remainder() -> None:
    # quotas 3.5, 2.1, 1.4 -> floors 3, 2, 1; one left, to the largest remainder (trainer 0)
    assert shares({0: 5, 1: 3, 2: 2}, 7) == {0: 4, 1: 2, 2: 1}
    # quotas 1.4, 2.1, 3.5 with ids reversed: the remainder goes by size, not by id
    assert shares({0: 2, 1: 3, 2: 5}, 7) == {0: 1, 1: 2, 2: 4}
    # quotas 0.6·5 = 3.0... : 6 workers, weights 1, 2, 3 -> 1, 2, 3 exactly
    assert shares({4: 1, 7: 2, 9: 3}, 6) == {4: 1, 7: 2, 9: 3}


def test_shares_tie_broken_by_trainer_id() -> None:
    # equal quotas 4/3: the single leftover worker goes to the lowest id
    assert shares({0: 1, 1: 1, 2: 1}, 4) == {0: 2, 1: 1, 2: 1}
    assert shares({3: 5, 1: 5, 2: 5}, 4) == {1: 2, 2: 1, 3: 1}
    # quotas 3, 1.5, 1.5: trainers 1 and 2 tie for the leftover worker -> trainer 1
    assert shares({0: 8, 1: 4, 2: 4}, 6) == {0: 3, 1: 2, 2: 1}
    assert shares({0: 8, 2: 4, 1: 4}, 6) == {0: 3, 1: 2, 2: 1}


@pytest.mark.parametrize(
    ("weights", "n", "expected"),
    [
        # quotas 5/3, 5/3, 20/3: floors 1, 1, 6; all remainders 2/3 -> the two leftovers go to ids 0, 1
        ({0: 32, 1: 32, 2: 128}, 10, {0: 2, 1: 2, 2: 6}),
        # quotas 4/3, 4/3, 28/3: floors 1, 1, 9; all remainders 1/3 -> the leftover goes to id 0
        ({0: 1, 1: 1, 2: 7}, 12, {0: 2, 1: 1, 2: 9}),
    ],
)
def test_shares_exact_tie_of_non_dyadic_remainders(weights: dict[int, int], n: int, expected: dict) -> None:
    assert shares(weights, n) == expected


def test_shares_floor_to_zero_gets_one() -> None:
    # quotas 3.92, 0.04, 0.04: floors 3, 0, 0 -> Hamilton gives 4, 0, 0 -> each trainer needs one
    assert shares({0: 100, 1: 1, 2: 1}, 4) == {0: 2, 1: 1, 2: 1}
    # the donor is the trainer most over its quota, not the one holding the most workers:
    # quotas 2.9, 1.6, 0.5 -> Hamilton 3, 2, 0; over quota by 0.1 and 0.4 -> trainer 1 gives
    assert shares({0: 29, 1: 16, 2: 5}, 5) == {0: 3, 1: 1, 2: 1}


def test_shares_degenerate_weights_split_evenly() -> None:
    assert shares({0: 0, 1: 0, 2: 0}, 5) == {0: 2, 1: 2, 2: 1}
    assert shares({}, 3) == {}


def test_shares_too_many_trainers() -> None:
    with pytest.raises(ValueError):
        shares({0: 1, 1: 1, 2: 1}, 2)


def _hamilton_ok(weights: dict[int, float], n: int, count: dict[int, int]) -> None:
    assert sorted(count) == sorted(weights)
    assert sum(count.values()) == n
    assert all(v >= 1 for v in count.values())
    total = sum(weights.values())
    quota = {t: n * weights[t] / total for t in weights}
    if all(q >= 1 for q in quota.values()):
        # no minimum-one correction needed: the quota rule of Hamilton's method holds
        for t in weights:
            assert math.floor(quota[t]) <= count[t] <= math.ceil(quota[t])
        # and the extra workers went to the largest remainders
        got_extra = [t for t in weights if count[t] > math.floor(quota[t])]
        missed = [t for t in weights if count[t] == math.floor(quota[t])]
        if got_extra and missed:
            assert min(quota[t] % 1 for t in got_extra) >= max(quota[t] % 1 for t in missed) - 1e-12


def test_shares_invariants_random_sweep() -> None:
    rng = random.Random(0)
    for _ in range(1500):
        k = rng.randint(1, 6)
        ids = rng.sample(range(20), k)
        weights = {t: float(rng.choice([rng.randint(1, 8), rng.randint(1, 1000)])) for t in ids}
        n = rng.randint(k, 24)
        _hamilton_ok(weights, n, shares(weights, n))


# ---------------------------------------------------------------------------------------------------
# allocate
# ---------------------------------------------------------------------------------------------------


def test_allocate_fresh_deals_in_order() -> None:
    assert allocate({0: 4, 1: 4}, 4) == {0: 0, 1: 0, 2: 1, 3: 1}
    assert allocate({0: 1, 1: 3, 2: 4}, 8) == {0: 0, 1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2, 7: 2}


def test_allocate_workers_stay_put() -> None:
    current = {0: 0, 1: 0, 2: 1, 3: 1}
    # the new shares are 3 and 1: worker 2 stays with trainer 1, only worker 3 moves
    out = allocate({0: 3, 1: 1}, 4, current)
    assert out == {0: 0, 1: 0, 2: 1, 3: 0}
    # unchanged shares: nobody moves, even when the layout is not the fresh one
    current = {0: 1, 1: 0, 2: 1, 3: 0}
    assert allocate({0: 2, 1: 2}, 4, current) == current


def test_allocate_after_merge() -> None:
    # trainer 1 merged into trainer 0; trainer 1's worker goes where room is, nobody else moves
    current = {0: 0, 1: 1, 2: 2, 3: 2}
    out = allocate({0: 8, 2: 8}, 4, current)
    assert out == {0: 0, 1: 0, 2: 2, 3: 2}
    # shares 3, 1: trainer 2 keeps its lowest worker, the others fill trainer 0
    out = allocate({0: 24, 2: 8}, 4, current)
    assert out == {0: 0, 1: 0, 2: 2, 3: 0}


def test_allocate_demand_differs_from_requests() -> None:
    current = {0: 0, 1: 0, 2: 0, 3: 1}
    requests = {0: 1, 1: 1}
    by_req = allocate(requests, 4, current, mode="requests")
    by_demand = allocate(requests, 4, current, mode="demand")
    assert Counter(by_req.values()) == {0: 2, 1: 2}
    assert Counter(by_demand.values()) == {0: 3, 1: 1}  # weights 3·1 and 1·1
    assert by_demand == current
    # demand: held workers × request. 2·1 vs 2·3 -> 1 and 3 workers
    current = {0: 0, 1: 0, 2: 1, 3: 1}
    assert Counter(allocate({0: 1, 1: 3}, 4, current, mode="demand").values()) == {0: 1, 1: 3}
    # a trainer holding no worker counts as holding one
    current = {0: 0, 1: 0, 2: 0, 3: 0}
    assert Counter(allocate({0: 1, 1: 3}, 4, current, mode="demand").values()) == {0: 2, 1: 2}
    # without a current allocation, demand is the request
    assert allocate(requests, 4, mode="demand") == allocate(requests, 4)


def test_allocate_errors() -> None:
    with pytest.raises(ValueError):
        allocate({0: 1, 1: 1, 2: 1}, 2)
    with pytest.raises(ValueError):
        allocate({0: 1, 1: 1}, 4, mode="greedy")


def test_allocate_invariants_random_sweep() -> None:
    rng = random.Random(1)
    for _ in range(1500):
        k = rng.randint(1, 6)
        ids = sorted(rng.sample(range(10), k))
        n = rng.randint(k, 20)
        requests = {t: rng.randint(1, 512) for t in ids}
        old_ids = ids + rng.sample(range(10, 15), rng.randint(0, 2))  # some trainers merged away
        current = {w: rng.choice(old_ids) for w in range(n)} if rng.random() < 0.8 else None
        mode = rng.choice(["requests", "demand"])
        out = allocate(requests, n, current, mode=mode)
        assert sorted(out) == list(range(n))  # every worker assigned
        counts = Counter(out.values())
        assert set(counts) == set(ids) and all(counts[t] >= 1 for t in ids)
        if current is None:
            assert [out[w] for w in range(n)] == sorted(out.values())  # dealt out in order
            continue
        # minimal moves: as many workers stay as the new counts allow
        held = Counter(t for t in current.values() if t in requests)
        stayed = sum(1 for w in range(n) if out[w] == current[w])
        assert stayed == sum(min(held[t], counts[t]) for t in ids)
        # the ones that stay are the lowest worker ids of their trainer
        for t in ids:
            mine = sorted(w for w in range(n) if current[w] == t)
            assert [w for w in mine if out[w] == t] == mine[: min(held[t], counts[t])]
        if mode == "requests":
            assert dict(counts) == shares({t: float(b) for t, b in requests.items()}, n)


def test_members() -> None:
    assert members({0: 1, 1: 0, 2: 1, 3: 2}) == {0: [1], 1: [0, 2], 2: [3]}
    assert members({3: 0, 1: 0, 2: 0}) == {0: [1, 2, 3]}
    assert members({}) == {}


def test_split_follows_speed_by_largest_remainder() -> None:
    from adloco.library.algorithms.allocation import split

    assert split(16, {0: 1, 1: 1, 2: 0.5, 3: 0.25}) == {0: 6, 1: 6, 2: 3, 3: 1}  # quotas 5.8, 5.8, 2.9, 1.5
    assert split(12, {0: 1.0, 1: 0.5}) == {0: 8, 1: 4}
    assert split(8, {0: 1, 1: 1, 2: 1, 3: 1}) == {0: 2, 1: 2, 2: 2, 3: 2}
    assert split(4, {0: 100, 1: 1, 2: 1}) == {0: 2, 1: 1, 2: 1}  # at least one each
    assert split(7, {0: 1, 1: 1}) == {0: 4, 1: 3}  # ties by id
    assert sum(split(101, {0: 0.3, 1: 0.7, 2: 0.11}).values()) == 101


def test_by_capacity_shares_total_speed_by_request() -> None:
    from adloco.library.algorithms.allocation import by_capacity

    # trainers asking equally get equal capacity: the two fast workers apart, a slow one with each
    got = by_capacity({0: 4, 1: 4}, {0: 1, 1: 1, 2: 0.5, 3: 0.5})
    cap = {t: sum(s for w, s in {0: 1, 1: 1, 2: 0.5, 3: 0.5}.items() if got[w] == t) for t in (0, 1)}
    assert cap == {0: 1.5, 1: 1.5}
    # a trainer asking three times as much gets about three times the speed, and everyone a worker
    speeds = {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.25, 4: 0.25}
    got = by_capacity({0: 3, 1: 1}, speeds)
    cap = {t: sum(s for w, s in speeds.items() if got[w] == t) for t in (0, 1)}
    assert set(got.values()) == {0, 1} and cap[0] > 2 * cap[1]
    # equal speeds: the request shares, workers staying where they are
    assert by_capacity({0: 4, 1: 12}, dict.fromkeys(range(4), 1.0), {0: 0, 1: 1, 2: 1, 3: 1}) == {
        0: 0,
        1: 1,
        2: 1,
        3: 1,
    }


def test_split_with_a_fixed_cost_per_step_equalises_step_times() -> None:
    """With a step's fixed cost c (rows), (c + m_w)/s_w is equal: rows move from slow workers to fast
    ones (hand-computed: scale (16 + 4·2)/2.75 gives 6.73, 6.73, 2.36, 0.18; worker 3 held at one row,
    the others share 15 rows at scale (15 + 3·2)/2.5 = 8.4: 6.4, 6.4, 2.2)."""
    from adloco.library.algorithms.allocation import split

    speeds = {0: 1, 1: 1, 2: 0.5, 3: 0.25}
    assert split(16, speeds, fixed=2) == {0: 7, 1: 6, 2: 2, 3: 1}
    assert split(16, speeds, fixed=0) == split(16, speeds)  # no fixed cost: proportional, as before
    assert split(12, {0: 1.0, 1: 0.5}, fixed=2) == {0: 9, 1: 3}  # scale 16/1.5: quotas 8.67 and 3.33
    assert split(8, {0: 1, 1: 1, 2: 1, 3: 1}, fixed=5) == {0: 2, 1: 2, 2: 2, 3: 2}  # equal speeds: equal
    times = {w: (2 + m) / speeds[w] for w, m in split(16, speeds, fixed=2).items() if w != 3}
    plain = {w: (2 + m) / speeds[w] for w, m in split(16, speeds).items() if w != 3}
    assert max(times.values()) - min(times.values()) < max(plain.values()) - min(plain.values())


def test_a_speed_net_of_the_fixed_cost_does_not_depend_on_the_share() -> None:
    """The flaw RESULTS' heterogeneous section measured: a step costing α + β·m makes a worker given
    fewer rows look slower per row, and so get fewer still. Counted net of α (fixed = α/β rows a pass),
    one device measures one speed whatever its share."""
    from adloco.library.round import WorkerRound, measured_speed

    alpha, beta = 0.02, 0.01  # fixed = 2 rows

    def worker(m: int, steps: int = 12) -> WorkerRound:
        return WorkerRound(
            steps=steps, examples=steps * m, compute_s=steps * (alpha + beta * m), micro=m, accum=1
        )

    small, large = worker(1), worker(8)
    assert measured_speed(small) < 0.5 * measured_speed(large)  # rows per second: 33 against 80
    assert measured_speed(small, alpha / beta) == pytest.approx(1 / beta)
    assert measured_speed(large, alpha / beta) == pytest.approx(1 / beta)
    assert measured_speed(WorkerRound()) == 0.0


def test_a_round_plan_shares_rows_by_the_fixed_cost_it_is_given() -> None:
    from adloco.library.round import plan_round
    from adloco.library.settings import AdaptiveBatch, Switch

    def rows(fixed: float) -> dict[int, int]:
        plans = plan_round(
            {0: 8},
            {0: [0, 1, 2, 3]},
            dict.fromkeys(range(4), 64),
            "accumulate",
            Switch(),
            AdaptiveBatch(test="none", statistics=False),
            {0: {0: 1.0, 1: 1.0, 2: 0.5, 3: 0.25}},
            fixed,
        )
        return {w: p.effective for w, p in plans.items()}

    assert rows(0) == {0: 12, 1: 11, 2: 6, 3: 3}  # 32 rows by speed: 11.64, 11.64, 5.82, 2.91
    assert rows(4) == {
        0: 13,
        1: 13,
        2: 5,
        3: 1,
    }  # (4 + m)/s equal: worker 3 (0.36) held at 1, then 13.2, 13.2, 4.6
