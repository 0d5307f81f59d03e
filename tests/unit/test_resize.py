"""A run resumed by hand on another number of workers (ALGORITHM.md §9.2), in this process: trainers
merge when they outnumber the workers, requests follow elastic.batch, new workers join. The same under
torch's elastic agent, with real processes, is tests/integration/test_elastic.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adloco.cli import main
from tests.helpers import ELASTIC_RUN, check_whole, only_run, run_events, set_args

TINY = ELASTIC_RUN


def sets(**extra: str) -> list[str]:
    return set_args(TINY, **extra)


def four_worker_run(out: Path, corpus: Path) -> Path:
    args = sets(algorithm__rounds="2", algorithm__workers="4", algorithm__trainers="4", merge__every="10")
    assert main(["train", *args, "--set", f"data.source={corpus}", "--set", f"logging.out_dir={out}"]) == 0
    return only_run(out)


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory, text_corpus: Path) -> Path:
    return four_worker_run(tmp_path_factory.mktemp("four"), text_corpus)


def allocation_after_resume(run: Path) -> tuple[dict[str, int], dict[str, int], dict[str, Any]]:
    evs = run_events(run)
    member = next(e for e in evs if e["event"] == "membership")
    third = next(e for e in evs if e["event"] == "round" and e["round"] == 3)
    trainers = [e for e in evs if e["event"] == "trainer" and e["round"] == 3]
    return third["allocation"], {str(e["trainer"]): e["request"] for e in trainers}, member


@pytest.mark.parametrize("batch", ["per_trainer", "per_worker"])
def test_resume_on_fewer_workers(tmp_path: Path, four: Path, batch: str) -> None:
    """4 trainers on 4 workers, resumed on 2: the two smallest merge twice... until 2 trainers are left;
    per_trainer doubles a trainer's request when its worker count halves, per_worker keeps it."""
    import shutil

    run = tmp_path / four.name
    shutil.copytree(four, run)
    before = json.loads((run / "summary.json").read_text())["requests_final"]
    args = ["--set", "algorithm.rounds=3", "--set", "algorithm.workers=2", "--set", f"elastic.batch={batch}"]
    assert main(["train", "--resume", str(run), *args]) == 0
    alloc, requests, member = allocation_after_resume(run)
    assert member["workers_before"] == 4 and member["workers"] == 2 and len(member["merged"]) == 2
    assert sorted(alloc) == ["0", "1"] and len(set(alloc.values())) == 2
    from adloco.library.algorithms import membership

    plan = membership.resize(
        {int(t): b for t, b in before.items()},
        {0: 0, 1: 1, 2: 2, 3: 3},
        2,
        batch=batch,
        cap=32,
    )
    assert requests == {str(t): b for t, b in plan.requests.items()}
    assert alloc == {str(w): t for w, t in plan.allocation.items()}
    check_whole(run, 3)


def test_resume_on_more_workers_in_one_process(tmp_path: Path, four: Path) -> None:
    import shutil

    run = tmp_path / four.name
    shutil.copytree(four, run)
    assert (
        main(["train", "--resume", str(run), "--set", "algorithm.rounds=3", "--set", "algorithm.workers=6"])
        == 0
    )
    alloc, _, member = allocation_after_resume(run)
    assert member["workers"] == 6 and member["joined"] == [4, 5] and member["merged"] == []
    assert len(alloc) == 6 and set(alloc.values()) == {0, 1, 2, 3}
    check_whole(run, 3)
