"""Runs that survive failures: torch's elastic agent restarts the processes and adloco continues from the
run's newest checkpoint with the workers there are; a resume on fewer workers under torchrun (the same in
one process is tests/unit/test_resize.py).

Everything listens on 127.0.0.1. Process faults come from tests/faultinject (first attempt only).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ELASTIC_RUN, check_whole, only_run, run_events, run_main, set_args, with_faults

TINY = ELASTIC_RUN


def sets(**extra: str) -> list[str]:
    return set_args(TINY, **extra)


def env(fault: str | None = None) -> dict[str, str]:
    return with_faults({**os.environ, "OMP_NUM_THREADS": "1"}, fault)


@pytest.mark.parametrize("shards", [1, 2])
def test_a_killed_process_is_restarted_and_the_run_finishes(
    tmp_path: Path, text_corpus: Path, shards: int
) -> None:
    """`adloco train --nproc N --max-restarts 1`: rank 1 is SIGKILLed at the start of round 3; the agent
    restarts the processes, they continue from round 2's checkpoint, and the run ends with exit 0. Two
    workers: in 2 processes (two trainers that merge), or with runtime.shards 2 in 4 (ALGORITHM.md §12),
    where the rank lost is one shard of worker 0: its worker is lost with it, and the restarted ranks
    reshard the checkpoint; there Δ also travels behind compute (sync.overlap delayed, ALGORITHM.md §13;
    one trainer of both workers): round 2's checkpoint holds its average in flight, which the restarted
    ranks apply at the end of round 3."""
    out = tmp_path / "runs"
    nproc, trainers = 2 * shards, "2" if shards == 1 else "1"
    cmd = [sys.executable, "-m", "adloco", "train", "--nproc", str(nproc), "--max-restarts", "1"]
    cmd += sets(algorithm__rounds="5", algorithm__workers="2", algorithm__trainers=trainers, merge__every="2")
    cmd += ["--set", f"runtime.shards={shards}"] + (["--set", "sync.overlap=delayed"] if shards > 1 else [])
    cmd += ["--set", f"data.source={text_corpus}", "--set", f"logging.out_dir={out}"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env("kill@1:3"), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    run = only_run(out)
    evs = check_whole(run, 5)
    (member,) = [e for e in evs if e["event"] == "membership"]
    assert member["round"] == 2 and member["workers"] == 2 and member["restarts"] == 1
    assert member["restart_s"] is not None and 0 < member["restart_s"] < 120
    summary = json.loads((run / "summary.json").read_text())
    assert summary["restarts"] == 1 and summary["rounds_lost"] == 0
    assert "membership: 2 workers (restart 1" in p.stdout
    ckpts = [e["round"] for e in evs if e["event"] == "checkpoint"]
    assert ckpts == [1, 2, 3, 4, 5]  # elastic runs checkpoint every round
    if shards > 1:  # round 4's Δ was in flight when its checkpoint was written
        meta = json.loads((run / "checkpoints" / "round-000004" / "state.json").read_text())
        assert [f["round"] for f in meta["algorithm"]["in_flight"]] == [4]
    else:  # the two trainers merged (round 2) before the restart and stay merged after it
        assert [e["round"] for e in evs if e["event"] == "merge"] == [2]


def test_resume_on_fewer_workers_under_torchrun(tmp_path: Path, text_corpus: Path) -> None:
    """4 trainers on 4 workers in one process (this one), resumed as 2 processes: the trainers merge down
    to 2 and the state reaches both processes from the one that read the checkpoint."""
    out = tmp_path / "runs"
    args = sets(algorithm__rounds="2", algorithm__workers="4", algorithm__trainers="4", merge__every="10")
    p = run_main("train", *args, "--set", f"data.source={text_corpus}", "--set", f"logging.out_dir={out}")
    assert p.returncode == 0, p.stderr[-3000:]
    run = only_run(out)
    cmd = [sys.executable, "-m", "adloco", "train", "--resume", str(run), "--nproc", "2"]
    cmd += ["--set", "algorithm.rounds=3", "--set", "algorithm.workers=2"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    evs = check_whole(run, 3)
    member = next(e for e in evs if e["event"] == "membership")
    assert member["workers_before"] == 4 and member["workers"] == 2 and len(member["merged"]) == 2
    third = next(e for e in evs if e["event"] == "round" and e["round"] == 3)
    assert sorted(third["allocation"]) == ["0", "1"] and len(set(third["allocation"].values())) == 2


# -- two agents on one machine, as two machines would be -------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree(pid: int) -> list[int]:
    """pid and every process below it (the agent's workers run in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _kill_tree(pid: int) -> None:
    for p in _tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _wait(predicate: Any, seconds: float, what: str) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_agents_lose_one_and_gain_it_back(tmp_path: Path, text_corpus: Path) -> None:
    """Two torchrun agents (--nnodes 1:2, one process each) on 127.0.0.1. SIGKILL one agent and its
    worker mid-run: the other goes on alone (its two trainers merge onto its one worker); start it again:
    the run grows back to 2 workers. One process an agent is the lightest topology that loses a machine
    and gains it back (several processes under one agent: the killed-process tests above).

    The run is paced by what the test has seen, not by the clock: every rank waits at the start of round
    4 until the test has killed the agent (so the survivor's next collective fails), and at the start of
    round 6 until the agent started again has joined (so the run cannot end before it does)."""
    import torch.distributed as dist

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    store = dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=sock.fileno()
    )
    out = tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1:2",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "elastic-test",
        "--rdzv-conf",
        "join_timeout=120,last_call_timeout=1,close_timeout=5,keep_alive_interval=1,"
        "keep_alive_max_attempt=3,is_host=false",
        "--monitor-interval",
        "0.5",
        "--local-addr",
        "127.0.0.1",
        "-m",
        "adloco",
        "train",
        *sets(algorithm__rounds="8", algorithm__workers="2", algorithm__trainers="2", merge__every="4"),
        "--set",
        "runtime.threads=1",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={out}",
    ]
    killed, joined = tmp_path / "killed", tmp_path / "joined"
    e = {**env(f"hold@4:{killed},hold@6:{joined}"), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    e["GLOO_SOCKET_IFNAME"] = "lo"
    logs = tmp_path / "logs"
    logs.mkdir()
    agents: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        with (logs / f"{name}.out").open("wb") as o, (logs / f"{name}.err").open("wb") as r:
            p = subprocess.Popen(cmd, env=e, stdout=o, stderr=r, start_new_session=True)
        agents.append(p)
        return p

    run = out / "adloco-elastic-test"

    def rounds() -> list[dict[str, Any]]:
        return (
            [x for x in run_events(run) if x["event"] in ("round", "membership")]
            if (run / "metrics.jsonl").is_file()
            else []
        )

    try:
        a = start("a")
        time.sleep(2)
        b = start("b")
        _wait(lambda: any(x["event"] == "round" and x["round"] >= 3 for x in rounds()), 240, "round 3")
        _kill_tree(b.pid)
        killed.touch()  # the survivor's round 4 meets the lost peer
        _wait(
            lambda: any(x["event"] == "membership" and x["workers"] == 1 for x in rounds()), 180, "1 worker"
        )
        b2 = start("b2")
        _wait(
            lambda: any(
                x["event"] == "membership" and x["workers"] == 2 and x["workers_before"] == 1
                for x in rounds()
            ),
            180,
            "2 workers again",
        )
        joined.touch()
        assert a.wait(timeout=300) == 0, (logs / "a.err").read_text()[-3000:]
        assert b2.wait(timeout=120) == 0, (logs / "b2.err").read_text()[-3000:]
    finally:
        for p in agents:
            _kill_tree(p.pid)
        del store  # it owns the listening socket now
    evs = check_whole(run, 8)
    members = [(x["round"], x["workers"], x["workers_before"]) for x in evs if x["event"] == "membership"]
    assert [(w, before) for _, w, before in members] == [(1, 2), (2, 1)], members
    summary = json.loads((run / "summary.json").read_text())
    assert summary["restarts"] >= 2
