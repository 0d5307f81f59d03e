"""The network model of simulated wall time (ALGORITHM.md §7), against hand computations."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from adloco.library.comm.base import CommRecord, wire_bytes
from adloco.library.round import Totals, Traffic
from adloco.netmodel import bad_row, collective_seconds, comm_seconds, name_workers, round_time
from adloco.report import results
from tests.helpers import run_main

BW, LAT = 100e6, 2e-3  # 100 MB/s, 2 ms


def test_ring_all_reduce() -> None:
    # 4 workers, 8 MB: 2·3/4 · 8e6/1e8 = 0.12 s of bandwidth + 2·3 · 2 ms = 0.012 s of latency
    assert collective_seconds("all_reduce", 4, 8_000_000, BW, LAT) == pytest.approx(0.132)


def test_broadcast_and_gather() -> None:
    # broadcast to 5: 1e6/1e8 = 0.01 s + ceil(log2 5) = 3 hops · 2 ms
    assert collective_seconds("broadcast", 5, 1_000_000, BW, LAT) == pytest.approx(0.016)
    # all-gather of 32 bytes each among 4: 3 · 32/1e8 + 3 · 2 ms
    assert collective_seconds("all_gather", 4, 32, BW, LAT) == pytest.approx(0.006 + 96 / 1e8)


def test_one_worker_costs_nothing() -> None:
    assert collective_seconds("all_reduce", 1, 10**9, BW, LAT) == 0.0


def test_a_round() -> None:
    rows = [["delta", "all_reduce", 4, 8_000_000, 1], ["stats", "all_gather", 4, 32, 2]]
    comm = 0.132 + 2 * (0.006 + 96 / 1e8)
    assert comm_seconds(rows, BW, LAT) == pytest.approx(comm)
    compute = {0: 3.0, 1: 4.0, 2: 2.0, 3: 1.0}
    assert round_time(compute, rows, BW, LAT).seconds == pytest.approx(4.0 + comm)
    # worker 1 twice as fast, worker 3 four times slower: the slowest is now worker 3 (1.0 / 0.25 = 4.0)
    assert round_time(compute, rows, BW, LAT, [1, 2, 1, 0.25]).seconds == pytest.approx(4.0 + comm)
    assert round_time(compute, rows, BW, LAT, [1, 2, 1, 1]).seconds == pytest.approx(3.0 + comm)


AR = 0.132  # one all-reduce of 8 MB among 4 workers (test_ring_all_reduce)
AR2 = 2 * 1 / 2 * 8e6 / 1e8 + 2 * LAT  # one among 2 workers: 0.08 s + 4 ms


def test_disjoint_trainers_all_reduce_at_the_same_time() -> None:
    # two trainers of two workers each, their Δ among their own workers: one all-reduce's time, not two
    rows = [
        ["delta", "all_reduce", 2, 8_000_000, 1, [0, 1]],
        ["delta", "all_reduce", 2, 8_000_000, 1, [2, 3]],
    ]
    compute = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    assert round_time(compute, rows, BW, LAT).seconds == pytest.approx(1.0 + AR2)
    # the serial model (rows that name no workers) adds them
    assert round_time(compute, [r[:5] for r in rows], BW, LAT).seconds == pytest.approx(1.0 + 2 * AR2)
    # each trainer waits for its own slowest worker: trainer 0's Δ runs while worker 3 still computes
    slow = {0: 1.0, 1: 1.0, 2: 1.0, 3: 3.0}
    assert round_time(slow, rows, BW, LAT).seconds == pytest.approx(3.0 + AR2)
    # a collective among everyone waits for every worker, then the trainers go on side by side
    gather = ["stats", "all_gather", 4, 32, 1, [0, 1, 2, 3]]
    g = collective_seconds("all_gather", 4, 32, BW, LAT)
    assert round_time(slow, [gather, *rows], BW, LAT).seconds == pytest.approx(3.0 + g + AR2)
    # a trainer's count of collectives one after another on its workers
    twice = [["grad", "all_reduce", 2, 8_000_000, 3, [0, 1]], ["grad", "all_reduce", 2, 8_000_000, 3, [2, 3]]]
    assert round_time(compute, twice, BW, LAT).seconds == pytest.approx(1.0 + 3 * AR2)
    # overlapping groups serialise: a move from worker 1 to worker 2 after the two trainers' Δ
    move = ["move", "broadcast", 2, 8_000_000, 1, [1, 2]]
    b = collective_seconds("broadcast", 2, 8_000_000, BW, LAT)
    assert round_time(compute, [*rows, move], BW, LAT).seconds == pytest.approx(1.0 + AR2 + b)


def test_rows_of_older_runs_get_their_trainers_workers() -> None:
    old = [["stats", "all_gather", 4, 32, 1], ["delta", "all_reduce", 2, 8_000_000, 2]]
    named = name_workers(old, [[0, 1], [2, 3]])
    assert named == [
        ["stats", "all_gather", 4, 32, 1],  # not a per-trainer kind: holds every worker
        ["delta", "all_reduce", 2, 8_000_000, 1, [0, 1]],
        ["delta", "all_reduce", 2, 8_000_000, 1, [2, 3]],
    ]
    # ddp's gradients: a count of steps × trainers split evenly; trainers of one worker send nothing
    grads = [["grad", "all_reduce", 2, 8_000_000, 6]]
    assert name_workers(grads, [[0, 1], [2], [3, 4]]) == [
        ["grad", "all_reduce", 2, 8_000_000, 3, [0, 1]],
        ["grad", "all_reduce", 2, 8_000_000, 3, [3, 4]],
    ]
    # what cannot be split evenly, or matches no trainer, stays serial; named rows stay as they are
    assert name_workers([["delta", "all_reduce", 2, 8, 3]], [[0, 1], [2, 3]]) == [
        ["delta", "all_reduce", 2, 8, 3]
    ]
    assert name_workers([["delta", "all_reduce", 3, 8, 1]], [[0, 1], [2, 3]]) == [
        ["delta", "all_reduce", 3, 8, 1]
    ]
    assert name_workers([["delta", "all_reduce", 2, 8, 1, [2, 3]]], [[0, 1]]) == [
        ["delta", "all_reduce", 2, 8, 1, [2, 3]]
    ]
    # a round of one trainer prices as before
    one = [["delta", "all_reduce", 4, 8_000_000, 1]]
    assert round_time({0: 1.0, 1: 2.0}, name_workers(one, [[0, 1, 2, 3]]), BW, LAT).seconds == pytest.approx(
        2.0 + AR
    )


def test_a_rounds_collectives_are_rows_in_the_order_issued_joined_where_nothing_came_between() -> None:
    def rec(kind: str, op: str, group: tuple[int, ...], payload: int = 8, behind: float = 0.0) -> CommRecord:
        return CommRecord(
            kind, op, len(group), payload, wire_bytes(op, len(group), payload), 0.0, behind, group
        )

    a, b, everyone = (0, 1), (2, 3), (0, 1, 2, 3)
    recs = [rec("grad", "all_reduce", a), rec("grad", "all_reduce", b)] * 3  # ddp, two trainers interleaved
    recs += [
        rec("stats", "all_gather", everyone),
        rec("grad", "all_reduce", a),
    ]  # after the gather: a new row
    recs += [rec("delta", "all_reduce", (0,))]  # one worker: nothing on the network
    recs += [rec("delta", "all_reduce", b, behind=1.0)] * 2  # behind compute: rows of their own, as before
    old = CommRecord("move", "broadcast", 2, 8, 8)  # a checkpoint's record from before groups: every worker
    recs += [old, old]
    t = Traffic.count(recs, 0.0, Totals())
    assert t.collectives == [
        ["grad", "all_reduce", 2, 8, 3, [0, 1]],
        ["grad", "all_reduce", 2, 8, 3, [2, 3]],
        ["stats", "all_gather", 4, 8, 1, [0, 1, 2, 3]],
        ["grad", "all_reduce", 2, 8, 1, [0, 1]],
        ["move", "broadcast", 2, 8, 2],
    ]
    assert t.behind == [["delta", "all_reduce", 2, 8, 2, 1.0]]


def test_a_run_prices_its_trainers_side_by_side_and_an_older_runs_rows_the_same(
    tmp_path: Path, text_corpus: Path
) -> None:
    """Two trainers of two workers: each round's Δ all-reduces name their workers; the engine's simulated
    time, the report's, and the report's of the same run with its rows as older runs logged them (no
    workers) agree, and are below the price of the same collectives one after another."""
    out = tmp_path / "runs"
    sets = {
        "model.name": "llama-micro",
        "data.source": str(text_corpus),
        "data.seq_len": 8,
        "algorithm.method": "adloco",
        "algorithm.workers": 4,
        "algorithm.trainers": 2,
        "algorithm.rounds": 2,
        "algorithm.inner_steps": 1,
        "batch.initial": 2,
        "merge.policy": "none",
        "eval.max_examples": 4,
        "network.bandwidth": 1e5,
        "logging.out_dir": str(out),
        "logging.plots": "false",
        "logging.save_model": "false",
        "logging.progress": "off",
    }
    ran = run_main("train", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")])
    assert ran.returncode == 0, ran.stderr
    (run,) = list(out.iterdir())
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rounds = [e for e in lines if e["event"] == "round"]
    for r in rounds:
        deltas = [c for c in r["collectives"] if c[0] == "delta"]
        assert [c[5] for c in deltas] == [[0, 1], [2, 3]] and all(c[4] == 1 for c in deltas)
        serial = r["max_compute_s"] + comm_seconds(r["collectives"], 1e5, 1e-3)
        assert r["sim_s"] < serial - 0.5 * collective_seconds("all_reduce", 2, deltas[0][3], 1e5, 1e-3)
    engine = sum(r["sim_s"] for r in rounds)
    assert results.load(run).end.sim_s == pytest.approx(engine)
    old = tmp_path / "old"
    shutil.copytree(run, old)
    for e in lines:  # the rows as runs logged them before they named their workers
        if e["event"] == "round":
            merged: dict[tuple[Any, ...], int] = {}
            for c in e["collectives"]:
                merged[tuple(c[:4])] = merged.get(tuple(c[:4]), 0) + c[4]
            e["collectives"] = [[*k, n] for k, n in merged.items()]
    (old / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert any(c[4] == 2 for e in lines if e["event"] == "round" for c in e["collectives"])
    assert results.load(old).end.sim_s == pytest.approx(engine)


def test_a_corrupt_collectives_row_is_one_line_naming_the_run_and_the_round(tmp_path: Path) -> None:
    from tests.recorded import recorded_run

    assert (
        bad_row([["delta", "all_reduce", 2, 8, 1], ["stats", "all_gather", 4, 32, 1, [0, 1, 2, 3]]]) is None
    )
    assert bad_row([["delta", "all_reduce", 2, 8, 1, 1.0]], behind=True) is None
    for row in (
        ["delta", "all_reduce", 2, 8, 1, "ab"],  # workers not a list of ids
        ["delta", "all_reduce", 2, 8],  # too short
        ["delta", "scatter", 2, 8, 1],  # no such collective
        ["delta", "all_reduce", 2, -8, 1],  # a negative payload
        ["delta", "all_reduce", 2, 8, 1, [0, -1]],
        "delta",
    ):
        assert bad_row([row]) == row
    assert bad_row([["delta", "all_reduce", 2, 8, 1]], behind=True) is not None  # behind rows need a share
    run = recorded_run(tmp_path, "r", "adloco", [50.0, 40.0], 1000)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for e in lines:
        if e["event"] == "round" and e["round"] == 2:
            e["collectives"] = [["delta", "all_reduce", 2, 500, 1, "ab"]]
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    ran = run_main("report", str(run), "--out", str(tmp_path / "rep"))
    assert ran.returncode == 2 and not (tmp_path / "rep").exists()
    (line,) = ran.stderr.strip().splitlines()
    assert "metrics.jsonl, round 2: collectives row" in line and "Traceback" not in line


# -- links of their own: an upload, a factor per worker, sites (netmodel.Network) ---------------------

from adloco.netmodel import Link, Network, network, schedule  # noqa: E402


def test_one_site_of_symmetric_links_is_the_uniform_link() -> None:
    assert network(BW, LAT) == Link(BW, LAT)
    net = Network(BW, LAT)
    for op, n, b in (("all_reduce", 4, 8_000_000), ("all_gather", 4, 32), ("broadcast", 5, 10**6)):
        assert net.seconds_among(op, list(range(n)), b) == collective_seconds(op, n, b, BW, LAT)


def test_the_slower_direction_and_the_slowest_link_bound_a_ring() -> None:
    up = Network(BW, LAT, upload=BW / 4)  # uploads at 25 MB/s: a ring sends as much as it receives
    assert up.seconds_among("all_reduce", [0, 1, 2, 3], 8_000_000) == pytest.approx(
        collective_seconds("all_reduce", 4, 8_000_000, BW / 4, LAT)
    )
    slow = Network(BW, LAT, link_speeds=(1.0, 1.0, 0.5))  # worker 2 (and 5, ...) at half speed
    assert slow.seconds_among("all_reduce", [0, 1], 8e6) == collective_seconds("all_reduce", 2, 8e6, BW, LAT)
    assert slow.seconds_among("all_reduce", [0, 5], 8e6) == collective_seconds(
        "all_reduce", 2, 8e6, BW / 2, LAT
    )


WAN, WLAT = 1e6, 0.05  # 1 MB/s, 50 ms between sites


def test_a_collective_across_sites_is_hierarchical() -> None:
    net = Network(BW, LAT, sites=(3, 3, 2), site_bandwidth=WAN, site_latency=WLAT)
    assert [net.site(w) for w in range(8)] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert net.site(9) == 0  # a worker that joined: the site of 9 mod 8
    b = 8_000_000
    # inside the sites of 3 (reduce-scatter and all-gather): 2·2/3·b/BW + 4·LAT; between 3 sites: 2·2/3·b/WAN
    # + 4·WLAT
    want = 2 * 2 / 3 * b / BW + 4 * LAT + 2 * 2 / 3 * b / WAN + 4 * WLAT
    assert net.seconds_among("all_reduce", list(range(8)), b) == pytest.approx(want)
    # an all-gather of 100 bytes each: 2 more inside the largest site, then the 6 from other sites into the
    # smallest one (8 − 2) over the site link
    assert net.seconds_among("all_gather", list(range(8)), 100) == pytest.approx(
        2 * 100 / BW + 2 * LAT + 6 * 100 / WAN + 2 * WLAT
    )
    # a broadcast to a worker of another site crosses one site link
    assert net.seconds_among("broadcast", [0, 4], b) == pytest.approx(b / WAN + WLAT)
    # inside one site only its own links count
    assert net.seconds_among("all_reduce", [3, 4, 5], b) == collective_seconds("all_reduce", 3, b, BW, LAT)
    # every worker a site of its own: the ring on the site links
    alone = Network(BW, LAT, sites=(1, 1, 1, 1), site_bandwidth=WAN, site_latency=WLAT)
    assert alone.seconds_among("all_reduce", [0, 1, 2, 3], b) == pytest.approx(
        collective_seconds("all_reduce", 4, b, WAN, WLAT)
    )


def test_a_round_on_sites_runs_each_trainer_on_its_own_links() -> None:
    net = Network(BW, LAT, sites=(2, 2), site_bandwidth=WAN, site_latency=WLAT)
    inside = [
        ["delta", "all_reduce", 2, 8_000_000, 1, [0, 1]],
        ["delta", "all_reduce", 2, 8_000_000, 1, [2, 3]],
    ]
    across = [
        ["delta", "all_reduce", 2, 8_000_000, 1, [0, 2]],
        ["delta", "all_reduce", 2, 8_000_000, 1, [1, 3]],
    ]
    compute = {w: 1.0 for w in range(4)}
    assert round_time(compute, inside, BW, LAT, net=net).seconds == pytest.approx(1.0 + AR2)
    t = 8e6 / WAN + 2 * WLAT  # two sites of one worker each in the group: the site link's ring
    assert round_time(compute, across, BW, LAT, net=net).seconds == pytest.approx(1.0 + t)
    # worker by worker: the clocks of a schedule
    done = schedule({0: 1.0, 1: 2.0, 2: 0.5, 3: 0.5}, inside, BW, LAT, net=net)
    assert done == pytest.approx({0: 2.0 + AR2, 1: 2.0 + AR2, 2: 0.5 + AR2, 3: 0.5 + AR2})


def test_bad_links_are_refused() -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        Network(0.0, LAT)
    with pytest.raises(ValueError, match="several sites need"):
        Network(BW, LAT, sites=(2, 2))
    with pytest.raises(ValueError, match="link speeds"):
        Network(BW, LAT, link_speeds=(1.5,))
