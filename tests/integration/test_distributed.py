"""The torch.distributed backend: real processes, gloo on 127.0.0.1, one thread each.

Every path of the round through real processes (2 processes x 2 workers, so each trainer's workers and
every merge and move cross processes, with the compressed all-reduce and the statistics that need the
mean probe gradient): the in-process run's requests, merges, allocation and bytes, and its parameters
within float32 rounding. The round's logic across processes is tested in threads
(tests/unit/test_several_processes.py) and the compressed all-reduce bit for bit on gloo
(test_quantize_dist.py); here the transport is. A killed or hung rank makes the others exit non-zero in
seconds, naming the rank and the round; errors at start-up are said once.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import TINY_DIST, S, adloco_process, load_run, process_env, with_faults

# Every path: the augmented inner-product test (the mean probe gradient all-reduced), int8 with error
# feedback (the compressed all-to-all and all-gather), Nesterov (momentum moves with θ), merges every round.
EVERY_PATH = [
    "batch.test=augmented_inner_product",
    "batch.vartheta=0.05",
    "comm.dtype=int8",
    "comm.block=64",
    "comm.error_feedback=true",
    "comm.theta_dtype=int8",
]


def in_process_and_in_processes(
    tmp_path: Path, text_corpus: Path, sets: list[str]
) -> tuple[dict[str, Any], dict[str, Any], subprocess.CompletedProcess[str]]:
    """The same run in this process and in 2 gloo processes of 2 workers each: both runs and the second's
    process; asserts both succeeded and gave the same decisions, bytes, and model within float32 rounding."""
    from adloco.cli import main

    common = [*TINY_DIST, *S(*sets), "--set", f"data.source={text_corpus}"]
    inproc, dist = tmp_path / "inproc", tmp_path / "dist"
    assert main(["train", *common, "--set", f"logging.out_dir={inproc}"]) == 0
    p = adloco_process(
        "train",
        "--nproc",
        "2",
        "--set",
        "runtime.workers_per_process=2",
        *common,
        "--set",
        f"logging.out_dir={dist}",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    a, b = load_run(inproc), load_run(dist)
    assert b["rounds"] == a["rounds"]  # requests and allocation, every round
    assert b["merges"] == a["merges"]
    for key in ("bytes_total", "communications_total", "bytes_by_kind", "examples_total"):
        assert b["summary"][key] == a["summary"][key], key
    for name, ref in a["params"].items():
        assert (b["params"][name] - ref).abs().max().item() < 1e-5, name
    return a, b, p


def test_processes_give_the_in_process_run(tmp_path: Path, text_corpus: Path) -> None:
    a, b, p = in_process_and_in_processes(tmp_path, text_corpus, EVERY_PATH)
    assert len(a["merges"]) == 3
    requests = [r for _, r, _ in a["rounds"]]
    assert requests[-1] != requests[0]  # the batch test did move the requests
    assert a["summary"]["bytes_by_kind"]["probe"] > 0 and a["summary"]["bytes_by_kind"]["move"] > 0
    # every rank's numbers reach metrics.jsonl: one worker event per worker per round
    assert sorted(b["workers"]) == sorted(a["workers"])
    assert b["start"]["processes"] == 2
    assert b["start"]["threads_per_process"] == max(1, len(os.sched_getaffinity(0)) // 2)
    assert p.stdout.count("initial validation perplexity") == 1  # rank 0 alone prints progress


def test_processes_share_rows_by_speed_with_a_profile_they_fit_themselves(
    tmp_path: Path, text_corpus: Path
) -> None:
    """balance speed with runtime.profile auto across processes: speeds and the fitted α/β that share rows
    follow timings, yet every rank must take the same decisions (the agreement check stops a run that
    does not) and the run ends with its own profile."""
    speed = ["runtime.balance=speed", "runtime.profile=auto", "runtime.emulate_speed=[1, 0.5, 1, 0.25]"]
    speed += ["algorithm.trainers=1", "algorithm.rounds=5", "switch.b_max=8"]
    p = adloco_process(
        "train",
        "--nproc",
        "2",
        *TINY_DIST,
        *S(*speed, "runtime.workers_per_process=2"),
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={tmp_path}",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = list(tmp_path.iterdir())
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = {(e["round"], e["worker"]): e["examples"] for e in events if e["event"] == "worker"}
    assert rows[(5, 0)] > rows[(5, 3)]  # the slow worker was given fewer rows: shares followed speeds
    assert "runtime.profile auto" in json.loads((run / "profile.json").read_text())["source"]


@pytest.mark.parametrize(
    "sets",
    [
        ["sync.overlap=eager", "merge.every=3"],
        ["algorithm.inner_steps=4", "sync.fragments=2", "sync.fragment_delay=1", "merge.every=3"],
    ],
    ids=["eager", "streaming"],
)
def test_delta_behind_compute_in_processes_gives_the_in_process_run(
    tmp_path: Path, text_corpus: Path, sets: list[str]
) -> None:
    """ALGORITHM.md §13 through gloo processes (4 workers, 2 a process, 2 trainers): Δ on each process's
    background lane, in groups of its own, gives the in-process run's decisions, bytes and model; the
    Δ of rounds after the first ran behind compute."""
    in_process_and_in_processes(tmp_path, text_corpus, [*sets, "algorithm.trainers=2"])
    (run,) = list((tmp_path / "dist").iterdir())
    rounds = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    behind = [e["collectives_behind"] for e in rounds if e["event"] == "round"]
    assert any(r[0] == "delta" for r in behind[1])  # round 2: Δ (or its fragments) behind compute


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world: int, fault: str, args: list[str]) -> tuple[int, str, float, list[subprocess.Popen[str]]]:
    """Start ``world`` ranks by hand (env://, rank 0 hosts the store); wait for rank 0."""
    port = _free_port()
    procs = []
    t0 = time.monotonic()
    for r in range(world):
        e = {
            **process_env(),
            "RANK": str(r),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(r),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        e = with_faults(e, fault)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "adloco", "train", *args],
                env=e,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )
    try:
        _, err = procs[0].communicate(timeout=120)
    finally:
        for p in procs[1:]:
            p.kill()
            p.wait()
    return procs[0].returncode, err, time.monotonic() - t0, procs


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_lost_rank_stops_the_others_naming_it(tmp_path: Path, text_corpus: Path, fault: str) -> None:
    args = [
        *TINY_DIST,
        "--set",
        "algorithm.rounds=4",
        "--set",
        "runtime.timeout=10",  # also rank 1's wait for rank 0's start-up (its data): room for a busy machine
        "--set",
        "runtime.backend=torchdist",
        "--set",
        "runtime.workers_per_process=2",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    ]
    rc, err, seconds, _ = _spawn(2, f"{fault}@1:2", args)
    assert rc == 3, err
    line = [x for x in err.splitlines() if x.startswith("adloco: error:")]
    assert len(line) == 1 and "rank 0: round 2: rank 1 stopped answering" in line[0], err
    assert "Traceback" not in err
    assert seconds < 60  # start-up (imports) + at most runtime.timeout + the 2.5 s liveness check


def torchrun_errors(*sets: str) -> list[str]:
    """``adloco train`` in 2 processes that torchrun itself starts (no --nproc), run to its failure: the
    ``adloco: error:`` lines it wrote."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += ["-m", "adloco", "train", *TINY_DIST, *S(*sets)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=process_env(), timeout=120)
    assert p.returncode != 0
    return [line for line in p.stderr.splitlines() if line.startswith("adloco: error:")]


def test_layout_error_under_bare_torchrun_is_one_line(tmp_path: Path, text_corpus: Path) -> None:
    lines = torchrun_errors(
        "algorithm.workers=3",
        "algorithm.trainers=3",
        f"data.source={text_corpus}",
        f"logging.out_dir={tmp_path / 'runs'}",
    )
    assert lines == [
        "adloco: error: config: algorithm.workers = 3: must equal processes (2) x "
        "runtime.workers_per_process (1)"
    ]


def test_a_data_error_on_rank_0_is_said_once(tmp_path: Path) -> None:
    lines = torchrun_errors(
        "runtime.workers_per_process=2",
        "data.source=/nonexistent/corpus",
        f"logging.out_dir={tmp_path / 'runs'}",
    )
    assert lines == [
        "adloco: error: data.source = '/nonexistent/corpus': no such file or folder (or use 'stdlib')"
    ]
    assert not (tmp_path / "runs").exists()
