"""Nothing lost: checkpoints, exact resume after SIGKILL or SIGTERM, numerical and memory faults.

Faults are injected into the subprocesses by ``tests/faultinject/sitecustomize.py`` (``with_faults``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adloco.engine import checkpoint
from tests.helpers import with_faults

TINY = {
    "model.name": "llama-micro",
    "data.tokenizer": "bpe:300",
    "data.seq_len": "16",
    "data.val_fraction": "0.2",
    "algorithm.rounds": "5",
    "algorithm.inner_steps": "3",
    "merge.every": "2",
    "batch.initial": "2",
    "switch.b_max": "2",
    "eval.max_examples": "8",
    "batch.eta": "0.3",
    "checkpoint.every": "2",
    "logging.progress": "plain",
    "logging.plots": "false",
    "runtime.balance": "equal",  # resumed runs must match bit for bit: shares must not follow timings
}


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


def only_run(out: Path) -> Path:
    (run,) = list(out.iterdir())
    return run


def rounds_logged(run: Path) -> list[int]:
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [e["round"] for e in events if e["event"] == "round"]


def weights(run: Path) -> bytes:
    return (run / "model" / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, text_corpus: Path) -> Path:
    """The uninterrupted in-process run every resumed run must reproduce bit for bit."""
    out = tmp_path_factory.mktemp("reference")
    p = train(out, text_corpus)
    assert p.returncode == 0, p.stderr
    return only_run(out)


def test_checkpoints_hold_the_full_state(reference: Path) -> None:
    kept = checkpoint.complete(reference)
    assert [p.name for p in kept] == ["round-000004", "round-000005"]  # every 2 rounds and the end; keep 2
    meta = json.loads((kept[-1] / "state.json").read_text())
    algo = meta["algorithm"]
    assert meta["format"] == 2
    assert meta["round"] == algo["round"] == 5 and len(algo["requests"]) == 2  # merged 4 -> 3 -> 2
    files = sorted(f.name for f in kept[-1].iterdir())
    assert files == sorted(
        ["state.json", "rng.safetensors"]
        + [f"worker-{w}.safetensors" for w in range(4)]
        + [f"trainer-{t}.safetensors" for t in algo["requests"]]
    )
    assert set(meta["files"]) == set(files) - {"state.json"}
    assert all(algo["replicas"][str(w)]["inner"] for w in range(4))
    from safetensors.torch import load_file

    w0 = load_file(kept[-1] / "worker-0.safetensors")
    assert set(w0) == {"exp_avg", "exp_avg_sq", "step"} and w0["exp_avg"].numel() == algo["parameters"]
    assert w0["step"].tolist() == [15.0, 15.0]  # 5 rounds x H = 3, in each of the two parameter groups
    assert not list((reference / "checkpoints").glob(".tmp-*"))


def test_a_killed_run_resumes_bit_for_bit(tmp_path: Path, text_corpus: Path, reference: Path) -> None:
    out = tmp_path / "runs"
    p = train(out, text_corpus, fault="kill@0:4")  # SIGKILL at the start of round 4: round 3 is lost
    assert p.returncode == -9
    run = only_run(out)
    assert [c.name for c in checkpoint.complete(run)] == ["round-000002"]
    assert rounds_logged(run) == [1, 2, 3]
    p = adloco("train", "--resume", str(run))
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
    assert p.stderr.strip().splitlines()[-2:] == [
        "adloco: stopped by SIGTERM in round 4: checkpoint round-000003 written",
        f"resume with: adloco train --resume {run}",
    ]
    assert rounds_logged(run) == [1, 2, 3]
    p = adloco("train", "--resume", str(run))
    assert p.returncode == 0, p.stderr
    assert weights(run) == weights(reference)  # the stopped round was undone, then replayed exactly


def test_ctrl_c_stops_with_130(tmp_path: Path, text_corpus: Path) -> None:
    out = tmp_path / "runs"
    p = train(out, text_corpus, fault="int@0:2:1")
    assert p.returncode == 130, p.stderr
    run = only_run(out)
    assert (
        f"adloco: stopped by SIGINT in round 2: checkpoint round-000001 written\nresume with: adloco train --resume {run}"
        in p.stderr
    )
    assert rounds_logged(run) == [1] and [c.name for c in checkpoint.complete(run)] == ["round-000001"]


@pytest.mark.slow  # over 25 s: CI runs it with the slow tests
def test_a_killed_rank_resumes_bit_for_bit(tmp_path: Path, text_corpus: Path) -> None:
    extra = {"runtime__workers_per_process": "2", "runtime__timeout": "20"}
    full, cut = tmp_path / "full", tmp_path / "cut"
    p = train(full, text_corpus, "--nproc", "2", **extra)
    assert p.returncode == 0, p.stderr
    p = train(cut, text_corpus, "--nproc", "2", fault="kill@1:4", **extra)
    assert p.returncode != 0 and "rank 1 stopped answering" in p.stderr
    run = only_run(cut)
    p = adloco("train", "--nproc", "2", "--resume", str(run))
    assert p.returncode == 0, p.stderr
    assert rounds_logged(run) == [1, 2, 3, 4, 5]
    assert weights(run) == weights(only_run(full))
    # SIGTERM to rank 0 alone, mid-round: rank 1 learns it from the round's gather, both stop and checkpoint
    stopped = tmp_path / "stopped"
    p = train(stopped, text_corpus, "--nproc", "2", fault="term@0:4:2", **extra)
    assert p.returncode == 143, p.stderr
    run = only_run(stopped)
    assert "adloco: stopped by SIGTERM in round 4: checkpoint round-000003 written" in p.stderr
    assert f"resume with: adloco train --nproc 2 --resume {run}" in p.stderr
    p = adloco("train", "--nproc", "2", "--resume", str(run))
    assert p.returncode == 0, p.stderr
    assert weights(run) == weights(only_run(full))


def test_a_corrupt_checkpoint_is_refused_and_the_previous_one_used(
    tmp_path: Path, text_corpus: Path, reference: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    last = run / "checkpoints" / "round-000005" / "worker-1.safetensors"
    last.write_bytes(last.read_bytes()[:-100])
    p = adloco("train", "--resume", str(run))
    assert p.returncode == 2
    assert p.stderr.strip() == (
        f"adloco: error: checkpoint '{run / 'checkpoints' / 'round-000005'}': worker-1.safetensors is truncated "
        "(its size or checksum does not match)"
    )
    p = adloco("train", "--resume", str(run / "checkpoints" / "round-000004"))
    assert p.returncode == 0, p.stderr
    assert weights(run) == weights(reference)


def test_a_checkpoint_of_another_method_is_refused(
    tmp_path: Path, text_corpus: Path, reference: Path
) -> None:
    other = tmp_path / "other"
    p = train(other, text_corpus, algorithm__method="diloco", algorithm__rounds="2")
    assert p.returncode == 0, p.stderr
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    shutil.rmtree(run / "checkpoints")
    shutil.copytree(only_run(other) / "checkpoints", run / "checkpoints")
    p = adloco("train", "--resume", str(run))
    assert p.returncode == 2
    assert p.stderr.startswith(
        "adloco: error: --resume: algorithm.method = 'adloco' differs from the checkpoint's 'diloco': a resumed "
        "run keeps its model, data and method"
    )


def test_resume_may_extend_a_finished_run(tmp_path: Path, reference: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    p = adloco("train", "--resume", str(run), algorithm__rounds="6")
    assert p.returncode == 0, p.stderr
    assert rounds_logged(run) == [1, 2, 3, 4, 5, 6]
    assert json.loads((run / "summary.json").read_text())["rounds"] == 6


def test_a_non_finite_worker_is_left_out(tmp_path: Path, text_corpus: Path) -> None:
    out = tmp_path / "runs"
    p = train(out, text_corpus, fault="nan@1:2", algorithm__trainers="4", merge__every="3")
    assert p.returncode == 0, p.stderr
    assert "round 2: worker(s) 1 produced a non-finite loss or update; left out of the outer step" in p.stdout
    run = only_run(out)
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    faults = [e for e in events if e["event"] == "fault"]
    assert [(e["round"], e["kind"], e.get("worker"), e["trainer"]) for e in faults] == [
        (2, "non_finite", 1, 1),
        (2, "trainer_skipped", None, 1),  # worker 1 was trainer 1's only worker
    ]
    evals = [e for e in events if e["event"] == "eval"]
    assert all(e["val_ppl"] is not None for e in evals)  # every θ stayed finite
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_val_ppl"] < summary["initial_val_ppl"]


def test_persistent_faults_stop_the_run_with_a_usable_checkpoint(tmp_path: Path, text_corpus: Path) -> None:
    out = tmp_path / "runs"
    p = train(out, text_corpus, fault="nan@0:2-9", faults__max_bad_rounds="2", checkpoint__every="0")
    assert p.returncode == 4, p.stderr
    run = only_run(out)
    assert p.stderr.strip().splitlines()[-2:] == [
        "adloco: error: round 3: 2 rounds in a row with a non-finite worker loss or update "
        "(faults.max_bad_rounds); lower inner.lr or inner.clip; checkpoint round-000003 written",
        f"resume with: adloco train --resume {run} --set inner.lr=...",
    ]
    assert [c.name for c in checkpoint.complete(run)] == ["round-000003"]
    p = adloco("train", "--resume", str(run))  # the fault is gone (no hook): the run finishes
    assert p.returncode == 0, p.stderr
    assert rounds_logged(run) == [1, 2, 3, 4, 5]


def test_out_of_memory_halves_b_max_and_repeats_the_step(tmp_path: Path, text_corpus: Path) -> None:
    out = tmp_path / "runs"
    p = train(out, text_corpus, fault="oom@2:1")  # worker 2 cannot hold a micro-batch of 2 rows
    assert p.returncode == 0, p.stderr
    assert "round 1: worker 2 ran out of memory; b_max 2 -> 1" in p.stdout
    run = only_run(out)
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    workers = [e for e in events if e["event"] == "worker"]
    assert {e["micro"] for e in workers if e["worker"] == 2} == {1}
    assert {e["micro"] for e in workers if e["worker"] != 2} == {2}
    # the effective batch (what the math sees) is unchanged
    assert {e["examples"] for e in workers if e["round"] == 1} == {6}


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path: Path, text_corpus: Path) -> None:
    out = tmp_path / "runs"
    p = train(out, text_corpus, fault="diskfull@4")
    assert p.returncode == 2
    run = only_run(out)
    assert p.stderr.strip() == (
        f"adloco: error: checkpoint round-000004: cannot write into {run / 'checkpoints'} (No space left on "
        f"device); the previous checkpoint round-000002 is intact: free space, then resume with: adloco train "
        f"--resume {run}"
    )
    assert [c.name for c in checkpoint.complete(run)] == ["round-000002"]
    assert not list((run / "checkpoints").glob(".tmp-*"))
    p = adloco("train", "--resume", str(run))
    assert p.returncode == 0, p.stderr


def test_loading_a_checkpoint_never_unpickles(
    tmp_path: Path, reference: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    import torch

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("something was unpickled")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    ck = checkpoint.Checkpoint(checkpoint.complete(reference)[-1])
    assert ck.round == 5 and ck.tensors("trainer-0.safetensors")["theta"].dtype == torch.float32
    assert {f.suffix for f in ck.path.iterdir()} == {".json", ".safetensors"}
