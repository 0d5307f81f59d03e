"""The torch.distributed backend: real processes, gloo on 127.0.0.1, one thread each.

Same config and seed: the in-process backend, 4 processes and 2 processes x 2 workers give the same
requests, merges and allocation every round, the same bytes and messages, and final parameters within
1e-5. A killed or hung rank makes the others exit non-zero in seconds, naming the rank and the round.
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
from safetensors.torch import load_file

from tests.helpers import with_faults

TINY = [
    "--set",
    "model.name=llama-micro",
    "--set",
    "data.tokenizer=bpe:300",
    "--set",
    "data.seq_len=16",
    "--set",
    "data.val_fraction=0.2",
    "--set",
    "algorithm.rounds=3",
    "--set",
    "algorithm.inner_steps=2",
    "--set",
    "merge.every=1",
    "--set",
    "batch.initial=2",
    "--set",
    "switch.b_max=2",
    "--set",
    "eval.max_examples=4",
    "--set",
    "batch.eta=0.3",
    "--set",
    "logging.progress=plain",
    "--set",
    "runtime.balance=equal",  # compared with one process bit for bit: shares must not follow timings
    "--set",
    "outer.optimizer=nesterov",
]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def adloco(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adloco", *args], capture_output=True, text=True, env=env(), timeout=timeout
    )


def load_run(out: Path) -> dict[str, Any]:
    (run,) = list(out.iterdir())  # rank 0 alone writes a run directory
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {
        "rounds": [(e["round"], e["requests"], e["allocation"]) for e in events if e["event"] == "round"],
        "merges": [(e["round"], e["merged"], e["survivor"]) for e in events if e["event"] == "merge"],
        "workers": [(e["round"], e["worker"]) for e in events if e["event"] == "worker"],
        "start": next(e for e in events if e["event"] == "start"),
        "summary": json.loads((run / "summary.json").read_text()),
        "params": load_file(run / "model" / "model.safetensors"),
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, text_corpus: Path) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("inprocess")
    p = adloco("train", *TINY, "--set", f"data.source={text_corpus}", "--set", f"logging.out_dir={out}")
    assert p.returncode == 0, p.stderr
    return load_run(out)


@pytest.mark.parametrize(
    "layout", [["--nproc", "4"], ["--nproc", "2", "--set", "runtime.workers_per_process=2"]]
)
def test_processes_give_the_in_process_run(
    tmp_path: Path, text_corpus: Path, reference: dict[str, Any], layout: list[str]
) -> None:
    out = tmp_path / "runs"
    p = adloco(
        "train", *layout, *TINY, "--set", f"data.source={text_corpus}", "--set", f"logging.out_dir={out}"
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = load_run(out)
    assert got["rounds"] == reference["rounds"]  # requests and allocation, every round
    assert got["merges"] == reference["merges"] and len(got["merges"]) == 3
    for key in ("bytes_total", "communications_total", "bytes_by_kind", "examples_total"):
        assert got["summary"][key] == reference["summary"][key], key
    for name, ref in reference["params"].items():
        assert (got["params"][name] - ref).abs().max().item() < 1e-5, name
    # every rank's numbers reach metrics.jsonl: one worker event per worker per round
    assert sorted(got["workers"]) == sorted(reference["workers"])
    n_procs = int(layout[1])
    assert got["start"]["processes"] == n_procs
    cores = len(os.sched_getaffinity(0))
    assert got["start"]["threads_per_process"] == max(1, cores // n_procs)
    assert p.stdout.count("initial validation perplexity") == 1  # rank 0 alone prints progress


@pytest.mark.parametrize(
    "variant",
    [
        ["batch.test=augmented_inner_product", "batch.vartheta=0.05"],  # the shared mean probe gradient
        ["batch.estimator=paper", "merge.policy=none", "algorithm.trainers=2"],  # each worker's last gradient
        ["algorithm.method=ddp", "algorithm.trainers=2"],  # gradients every step, the stop flag riding along
    ],
    ids=["shared-mean", "paper", "ddp"],
)
def test_every_path_of_the_round_matches_in_process(
    tmp_path: Path, text_corpus: Path, variant: list[str]
) -> None:
    """The statistics that need a P-vector all-reduce, the paper estimator and DDP: 2 processes x 2
    workers give the in-process run's decisions, bytes and parameters."""
    sets = [a for v in variant for a in ("--set", v)]
    common = [*TINY, *sets, "--set", f"data.source={text_corpus}"]
    got = {}
    for name, layout in (
        ("inproc", []),
        ("dist", ["--nproc", "2", "--set", "runtime.workers_per_process=2"]),
    ):
        out = tmp_path / name
        p = adloco("train", *layout, *common, "--set", f"logging.out_dir={out}")
        assert p.returncode == 0, p.stderr[-3000:]
        got[name] = load_run(out)
    a, b = got["inproc"], got["dist"]
    assert a["rounds"] == b["rounds"] and a["merges"] == b["merges"]
    for key in ("bytes_total", "communications_total", "bytes_by_kind", "examples_total"):
        assert a["summary"][key] == b["summary"][key], key
    for name, ref in a["params"].items():
        assert (b["params"][name] - ref).abs().max().item() < 1e-5, name
    requests = [r for _, r, _ in a["rounds"]]
    if "ddp" not in variant[0]:
        assert requests[-1] != requests[0]  # the batch test did move the requests


@pytest.mark.parametrize(
    "dtype",
    [
        "bfloat16",
        "int8",
        pytest.param("float16", marks=pytest.mark.slow),
        pytest.param("int4", marks=pytest.mark.slow),
    ],
)
def test_compressed_wire_dtypes_across_processes(
    tmp_path: Path, text_corpus: Path, reference: dict[str, Any], dtype: str
) -> None:
    """2 processes x 2 workers against one process, through the compressed all-reduce: the same
    decisions and bytes, parameters within float32 rounding; Δ counted at its size on the wire."""
    sets = ["--set", f"comm.dtype={dtype}", "--set", "comm.error_feedback=true", *TINY]
    got = {}
    for name, layout in (
        ("dist", ["--nproc", "2", "--set", "runtime.workers_per_process=2"]),
        ("inproc", []),
    ):
        out = tmp_path / name
        p = adloco(
            "train", *layout, *sets, "--set", f"data.source={text_corpus}", "--set", f"logging.out_dir={out}"
        )
        assert p.returncode == 0, p.stderr[-3000:]
        got[name] = load_run(out)
    a, b = got["inproc"], got["dist"]
    assert a["rounds"] == b["rounds"] and a["merges"] == b["merges"]
    assert a["summary"]["bytes_by_kind"] == b["summary"]["bytes_by_kind"]
    for name, ref in a["params"].items():
        assert (b["params"][name] - ref).abs().max().item() < 1e-5, name
    ref = reference["summary"]["bytes_by_kind"]
    ratio = b["summary"]["bytes_by_kind"]["delta"] / ref["delta"]
    assert ratio == {"bfloat16": 0.5, "float16": 0.5}.get(dtype, ratio)
    assert ratio < {"int8": 0.3, "int4": 0.17}.get(dtype, 1.0)
    assert b["summary"]["bytes_by_kind"]["merge"] == ref["merge"]  # θ always travels in float32


def test_layout_must_match_the_processes(tmp_path: Path, text_corpus: Path) -> None:
    p = adloco(
        "train",
        "--nproc",
        "2",
        *TINY,
        "--set",
        "algorithm.workers=3",
        "--set",
        "algorithm.trainers=3",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    )
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if line.startswith("adloco: error:")]
    assert lines == [
        "adloco: error: config: algorithm.workers = 3: must equal processes (2) x "
        "runtime.workers_per_process (1)"
    ]
    assert not (tmp_path / "runs").exists()


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
            **env(),
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
        *TINY,
        "--set",
        "algorithm.rounds=4",
        "--set",
        "runtime.timeout=4",
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


def test_layout_error_under_bare_torchrun_is_one_line(tmp_path: Path, text_corpus: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "adloco",
        "train",
        *TINY,
        "--set",
        "algorithm.workers=3",
        "--set",
        "algorithm.trainers=3",
        "--set",
        f"data.source={text_corpus}",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=120)
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if line.startswith("adloco: error:")]
    assert lines == [
        "adloco: error: config: algorithm.workers = 3: must equal processes (2) x "
        "runtime.workers_per_process (1)"
    ]


def test_a_data_error_on_rank_0_is_said_once(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "adloco",
        "train",
        *TINY,
        "--set",
        "runtime.workers_per_process=2",
        "--set",
        "data.source=/nonexistent/corpus",
        "--set",
        f"logging.out_dir={tmp_path / 'runs'}",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=120)
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if line.startswith("adloco: error:")]
    assert lines == [
        "adloco: error: data.source = '/nonexistent/corpus': no such file or folder (or use 'stdlib')"
    ]
    assert not (tmp_path / "runs").exists()


def test_the_process_group_backend_follows_the_devices() -> None:
    from adloco.engine.dist.join import pick_backend
    from adloco.errors import UserError

    assert pick_backend("auto", use_cuda=False, local_processes=4, devices=0) == "gloo"
    assert pick_backend("auto", use_cuda=True, local_processes=2, devices=2) == "nccl"
    # NCCL refuses two ranks on one device ("Duplicate GPU detected"): auto falls back to gloo
    assert pick_backend("auto", use_cuda=True, local_processes=2, devices=1) == "gloo"
    assert pick_backend("gloo", use_cuda=True, local_processes=1, devices=1) == "gloo"
    with pytest.raises(UserError, match="2 processes on this machine share 1 CUDA device"):
        pick_backend("nccl", use_cuda=True, local_processes=2, devices=1)
    with pytest.raises(UserError, match="NCCL needs CUDA"):
        pick_backend("nccl", use_cuda=False, local_processes=1, devices=0)
