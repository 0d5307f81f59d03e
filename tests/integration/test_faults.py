"""Nothing lost when a process is: a SIGKILLed run, a SIGTERMed or Ctrl-C'd one, and a killed rank of a
distributed run resume bit for bit from their checkpoints. The runs that lose a process are real
processes, faults injected by ``tests/faultinject/sitecustomize.py`` (``with_faults``); the uninterrupted
runs and the resumes of one-process runs run in this process (``adloco train`` is the same code there,
without a start-up to pay for); the same resumes without a lost process are tests/unit/test_resume.py."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adloco.engine import checkpoint
from tests.helpers import RESUME_RUN, only_run, rounds_logged, run_main, weights, with_faults

TINY = RESUME_RUN
PROG = f"{shlex.quote(sys.executable)} -m adloco"  # how these processes were started: printed commands say so


def adloco(*args: str, fault: str | None = None, **sets: str) -> subprocess.CompletedProcess[str]:
    env = with_faults({**os.environ, "OMP_NUM_THREADS": "1"}, fault)
    flat = [a for k, v in sets.items() for a in ("--set", f"{k.replace('__', '.')}={v}")]
    return subprocess.run(
        [sys.executable, "-m", "adloco", *args, *flat], capture_output=True, text=True, env=env, timeout=300
    )


def train(
    out: Path, corpus: Path, *args: str, fault: str | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    sets = {**{k.replace(".", "__"): v for k, v in TINY.items()}, **extra}
    return adloco("train", *args, fault=fault, data__source=str(corpus), logging__out_dir=str(out), **sets)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, text_corpus: Path) -> Path:
    """The uninterrupted run every resumed run must reproduce bit for bit (in this process: the same
    bits as in a process of its own, one thread each)."""
    out = tmp_path_factory.mktemp("reference")
    sets = {**TINY, "data.source": str(text_corpus), "logging.out_dir": str(out)}
    p = run_main("train", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")])
    assert p.returncode == 0, p.stderr
    return only_run(out)


def test_a_killed_run_resumes_bit_for_bit(tmp_path: Path, text_corpus: Path, reference: Path) -> None:
    out = tmp_path / "runs"
    p = train(out, text_corpus, fault="kill@0:4")  # SIGKILL at the start of round 4: round 3 is lost
    assert p.returncode == -9
    run = only_run(out)
    assert [c.name for c in checkpoint.complete(run)] == ["round-000002"]
    assert rounds_logged(run) == [1, 2, 3]
    p = run_main("train", "--resume", str(run))
    assert p.returncode == 0, p.stderr
    assert f"resuming {run} from round-000002 (round 2 of 5)" in p.stdout
    assert rounds_logged(run) == [1, 2, 3, 4, 5]  # round 3 replayed once, nothing repeated
    assert weights(run) == weights(reference)
    summary = json.loads((run / "summary.json").read_text())
    ref = json.loads((reference / "summary.json").read_text())
    for key in ("final_val_ppl", "initial_val_ppl", "examples_total", "bytes_total", "communications_total"):
        assert summary[key] == ref[key], key


def test_sigterm_mid_round_stops_with_a_checkpoint(
    tmp_path: Path, text_corpus: Path, reference: Path
) -> None:
    out = tmp_path / "runs"
    p = train(out, text_corpus, fault="term@0:4:2")  # SIGTERM after inner step 2 of 3 of round 4
    assert p.returncode == 143, p.stderr
    run = only_run(out)
    ck = run / "checkpoints" / "round-000003"
    lines = p.stderr.strip().splitlines()
    assert lines[-5] == (  # at once: what will happen
        "adloco: SIGTERM received: stopping at the end of this inner step; round 4 will be undone and the run "
        f"saved as of round 3 (checkpoint {ck}, stopped.json); another signal is ignored while it saves"
    )
    assert not (run / "summary.json").exists()  # summary.json says a run finished
    summary = json.loads((run / "stopped.json").read_text())
    assert summary["stopped"] == "SIGTERM" and summary["rounds"] == 3
    assert lines[-4] == f"adloco: stopped by SIGTERM in round 4: round 4 undone; checkpoint written: {ck}"
    assert lines[-3].startswith("after 3 round(s): validation perplexity ")
    assert lines[-2:] == [
        f"plots and report: {PROG} report {run}",
        f"resume with: {PROG} train --resume {run}",
    ]
    assert rounds_logged(run) == [1, 2, 3]
    p = run_main("train", "--resume", str(run))
    assert p.returncode == 0, p.stderr
    assert weights(run) == weights(reference)  # the stopped round was undone, then replayed exactly


def test_ctrl_c_stops_with_130(tmp_path: Path, text_corpus: Path) -> None:
    out = tmp_path / "runs"
    p = train(out, text_corpus, fault="int@0:2:1")
    assert p.returncode == 130, p.stderr
    run = only_run(out)
    assert (
        f"adloco: stopped by SIGINT in round 2: round 2 undone; checkpoint written: {run}/checkpoints/round-000001"
        in p.stderr
    )
    assert p.stderr.strip().endswith(f"resume with: {PROG} train --resume {run}")
    assert rounds_logged(run) == [1] and [c.name for c in checkpoint.complete(run)] == ["round-000001"]


def test_a_killed_rank_resumes_bit_for_bit(tmp_path: Path, text_corpus: Path) -> None:
    """2 processes: rank 1 SIGKILLed at round 4 (rank 0 names it and stops); the resume is then stopped by
    SIGTERM to rank 0 alone, mid-round 5 (rank 1 learns it from the round's gather, both stop and
    checkpoint); resumed again, the run ends with the uninterrupted run's model, bit for bit."""
    extra = {"runtime__workers_per_process": "2", "runtime__timeout": "20"}
    full, cut = tmp_path / "full", tmp_path / "cut"
    p = train(full, text_corpus, "--nproc", "2", **extra)
    assert p.returncode == 0, p.stderr
    p = train(cut, text_corpus, "--nproc", "2", fault="kill@1:4", **extra)
    assert p.returncode != 0 and "rank 1 stopped answering" in p.stderr
    run = only_run(cut)
    assert rounds_logged(run) == [1, 2, 3]
    p = adloco("train", "--nproc", "2", "--resume", str(run), fault="term@0:5:2")
    assert p.returncode == 143, p.stderr
    assert (
        f"adloco: stopped by SIGTERM in round 5: round 5 undone; checkpoint written: {run}/checkpoints/round-000004"
        in p.stderr
    )
    assert f"resume with: {PROG} train --nproc 2 --resume {run}" in p.stderr
    assert rounds_logged(run) == [1, 2, 3, 4]
    p = adloco("train", "--nproc", "2", "--resume", str(run))
    assert p.returncode == 0, p.stderr
    assert rounds_logged(run) == [1, 2, 3, 4, 5]
    assert weights(run) == weights(only_run(full))


def test_two_processes_write_their_own_parts_behind_training(tmp_path: Path, text_corpus: Path) -> None:
    """checkpoint.async_save with checkpoint.dir a file:// URL, 2 gloo processes of 2 workers: each rank
    writes its own file of every checkpoint (their sizes and checksums in state.json), behind training; the
    round-4 checkpoint resumed in this process (1 process, 4 workers: read back across the layout) ends
    with the 2-process run's model. A location one process cannot see (memory:// is each process's own)
    is refused in one line, exit 2."""
    from safetensors.torch import load_file

    url = f"file://{tmp_path / 'store'}"
    extra = {"runtime__workers_per_process": "2", "checkpoint__async_save": "true", "checkpoint__dir": url}
    p = train(tmp_path / "runs", text_corpus, "--nproc", "2", **extra)
    assert p.returncode == 0, p.stderr[-3000:]
    run = only_run(tmp_path / "runs")
    found = checkpoint.complete(run, url)
    assert [f.name for f in found] == ["round-000004", "round-000005"]
    folder = Path(found[0].url.removeprefix("file://"))
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= {f.name for f in folder.iterdir()}
    assert set(json.loads((folder / "state.json").read_text())["files"]) == {
        "__0_0.distcp",
        "__1_0.distcp",
        ".metadata",
    }
    whole = load_file(run / "model" / "model.safetensors")
    shutil.rmtree(found[-1].url.removeprefix("file://"))  # the newest gone: continue from round 4 here
    one = ("runtime.backend=inprocess", "runtime.workers_per_process=4", "runtime.threads=1")
    ran = run_main("train", "--resume", str(run), *[a for s in one for a in ("--set", s)])
    assert ran.returncode == 0, ran.stderr
    got = load_file(run / "model" / "model.safetensors")
    for name, ref in whole.items():
        assert (got[name] - ref).abs().max().item() < 1e-5, name
    p = train(
        tmp_path / "mem",
        text_corpus,
        "--nproc",
        "2",
        runtime__workers_per_process="2",
        checkpoint__dir="memory://ck",
    )
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == (
        "adloco: error: checkpoints: memory://ck/"
        + only_run(tmp_path / "mem").name
        + " is not reachable from "
        "rank 1 (every rank writes its own part: put checkpoint.dir, or logging.out_dir, on storage every "
        "machine shares)"
    )
