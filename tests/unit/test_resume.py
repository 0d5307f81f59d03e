"""Nothing lost: checkpoints, exact resume, refused checkpoints, numerical, memory and disk faults, in
this process (faults injected with monkeypatch, :mod:`tests.helpers`). Resumes after a real SIGKILL,
SIGTERM or SIGINT of a process are tests/integration/test_faults.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from adloco.cli import main
from adloco.engine import checkpoint
from adloco.engine.dist.env import program
from tests.helpers import RESUME_RUN, disk_full, only_run, out_of_memory, poison, rounds_logged, weights

TINY = RESUME_RUN


def adloco(*args: str, **sets: str) -> int:
    """``adloco ARGS --set K=V ...`` in this process; its exit code."""
    flat = [a for k, v in sets.items() for a in ("--set", f"{k.replace('__', '.')}={v}")]
    return main([*args, *flat])


def train(out: Path, corpus: Path, *args: str, **extra: str) -> int:
    sets = {**{k.replace(".", "__"): v for k, v in TINY.items()}, **extra}
    return adloco("train", *args, data__source=str(corpus), logging__out_dir=str(out), **sets)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, text_corpus: Path) -> Path:
    """The uninterrupted in-process run every resumed run must reproduce bit for bit."""
    out = tmp_path_factory.mktemp("reference")
    assert train(out, text_corpus) == 0
    return only_run(out)


def test_checkpoints_hold_the_full_state(reference: Path) -> None:
    """Format 3: one torch.distributed.checkpoint (this process's file and DCP's table) beside state.json,
    the run-level state with the size and SHA-256 of every file."""
    kept = checkpoint.complete(reference)
    assert [p.name for p in kept] == ["round-000004", "round-000005"]  # every 2 rounds and the end; keep 2
    folder = Path(kept[-1].url)
    meta = json.loads((folder / "state.json").read_text())
    algo = meta["algorithm"]
    assert meta["format"] == checkpoint.FORMAT == 3
    assert meta["round"] == algo["round"] == 5 and len(algo["requests"]) == 2  # merged 4 -> 3 -> 2
    files = sorted(f.name for f in folder.iterdir())
    assert files == sorted(["state.json", ".metadata", "__0_0.distcp"])  # one process: one file of tensors
    assert set(meta["files"]) == set(files) - {"state.json"}
    assert sorted(algo["replicas"]) == ["0", "1", "2", "3"]  # every worker's scalars
    ck = checkpoint.Checkpoint(kept[-1])
    from adloco.engine.checkpoint import storage

    saved = storage.tensors(storage.metadata(ck.url))
    # θ of the trainers alive (this outer optimizer keeps no state), each worker's inner state (the default,
    # auto, chose Muon on this CPU: its momentum on the hidden matrices, AdamW's moments on the rest; held
    # at the round's start too), the generators
    assert {k for k in saved if k.startswith("trainer/")} == {f"trainer/{t}/theta" for t in algo["requests"]}
    assert meta["driver"]["inner_optimizer"] == "muon"  # what auto chose, which a resume keeps
    moments = {"exp_avg", "exp_avg_sq", "step", "momentum_buffer"}
    assert {k.split("/")[2] for k in saved if k.startswith("worker/0/")} == {
        *moments,
        *(f"{k}.held" for k in moments),
    }
    assert saved["worker/0/exp_avg"][0] == (algo["parameters"],) and "rng/rank-0" in saved
    steps, held = ck.tensor("worker/0/step").tolist(), ck.tensor("worker/0/step.held").tolist()
    assert [s for s, h in zip(steps, held, strict=True) if h] == [15.0] * int(sum(held))  # 5 rounds x H = 3
    # AdamW's tensors count steps; Muon's matrices, the rest, hold its momentum instead
    assert (
        0 < sum(held) < len(held)
        and [1 - h for h in held] == ck.tensor("worker/0/momentum_buffer.held").tolist()
    )
    assert ck.verify() is None
    assert not list((reference / "checkpoints").glob(".tmp-*"))


def test_a_corrupt_checkpoint_is_refused_and_the_previous_one_used(
    tmp_path: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    last = run / "checkpoints" / "round-000005" / "__0_0.distcp"
    last.write_bytes(last.read_bytes()[:-100])
    capsys.readouterr()
    assert adloco("train", "--resume", str(run)) == 2
    assert capsys.readouterr().err.strip() == (
        f"adloco: error: checkpoint '{run / 'checkpoints' / 'round-000005'}': __0_0.distcp is truncated "
        "(its size or checksum does not match)"
    )
    altered = bytearray(last.read_bytes())
    shutil.copy(reference / "checkpoints" / "round-000005" / "__0_0.distcp", last)
    altered = bytearray(last.read_bytes())
    altered[-50] ^= 1  # the same size, one bit changed: the checksum catches it when the state is read
    last.write_bytes(bytes(altered))
    assert adloco("train", "--resume", str(run)) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("__0_0.distcp is corrupt (its size or checksum does not match)")
    )
    assert adloco("train", "--resume", str(run / "checkpoints" / "round-000004")) == 0
    assert weights(run) == weights(reference)


def test_a_checkpoint_of_another_method_is_refused(
    tmp_path: Path, text_corpus: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    assert train(other, text_corpus, algorithm__method="diloco", algorithm__rounds="2") == 0
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    shutil.rmtree(run / "checkpoints")
    shutil.copytree(only_run(other) / "checkpoints", run / "checkpoints")
    capsys.readouterr()
    assert adloco("train", "--resume", str(run)) == 2
    assert capsys.readouterr().err.startswith(
        "adloco: error: --resume: algorithm.method = 'adloco' differs from the checkpoint's 'diloco': a resumed "
        "run keeps its model, data and method"
    )


def test_resume_may_extend_a_finished_run(
    tmp_path: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    capsys.readouterr()
    assert adloco("train", "--resume", str(run), algorithm__rounds="6") == 0
    assert rounds_logged(run) == [1, 2, 3, 4, 5, 6]
    assert json.loads((run / "summary.json").read_text())["rounds"] == 6
    # the cosine schedule is laid over the new length: said, with the lr it goes on at
    said = [x for x in capsys.readouterr().out.splitlines() if x.startswith("inner lr:")]
    assert (
        len(said) == 1
        and said[0].startswith(
            "inner lr: its cosine schedule now spans 6 rounds (the checkpoint's: 5), so after round 5 it goes on at "
        )
        and said[0].endswith(", not 0.0004 (inner.schedule constant, no warmup, continues it unchanged)")
    )


def test_a_constant_lr_run_extended_says_nothing_of_its_schedule(
    tmp_path: Path, text_corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train(tmp_path, text_corpus, inner__schedule="constant", algorithm__rounds="2") == 0
    capsys.readouterr()
    assert adloco("train", "--resume", str(only_run(tmp_path)), algorithm__rounds="3") == 0
    out = capsys.readouterr().out
    assert "resuming" in out and "inner lr:" not in out


@pytest.mark.long
@pytest.mark.parametrize(
    "sets",
    [
        {"sync__overlap": "eager"},
        {"algorithm__inner_steps": "4", "sync__fragments": "2", "sync__fragment_delay": "1"},
        {"comm__dtype": "topk", "comm__topk_block": "64", "algorithm__trainers": "2"},  # 2 workers a trainer
    ],
    ids=["eager", "streaming", "topk"],
)
def test_a_run_with_delta_in_flight_resumes_bit_for_bit(
    tmp_path: Path, text_corpus: Path, sets: dict[str, str]
) -> None:
    """ALGORITHM.md §13: round 4's checkpoint holds the average still in flight (eager) or the workers'
    parameters between their fragments' synchronizations (streaming); ALGORITHM.md §9.4: each worker's
    topk error feedback, most of its Δ unsent (topk); resumed there, the run ends with the uninterrupted
    run's model and bytes."""
    out = tmp_path / "ref"
    assert train(out, text_corpus, merge__every="5", **sets) == 0
    ref = only_run(out)
    meta = json.loads((ref / "checkpoints" / "round-000004" / "state.json").read_text())
    if "sync__overlap" in sets:
        assert [f["round"] for f in meta["algorithm"]["in_flight"]] == [4] * len(
            meta["algorithm"]["requests"]
        )
    if "comm__dtype" in sets:
        from adloco.engine.checkpoint import storage

        ck = checkpoint.Checkpoint(checkpoint.complete(ref)[0])
        assert {f"worker/{w}/feedback_error" for w in range(4)} <= set(
            storage.tensors(storage.metadata(ck.url))
        )
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    assert adloco("train", "--resume", str(run / "checkpoints" / "round-000004")) == 0
    assert weights(run) == weights(ref)
    done = [json.loads((r / "summary.json").read_text()) for r in (ref, run)]
    assert done[0]["bytes_total"] == done[1]["bytes_total"]


def test_a_run_with_a_batch_schedule_resumes_bit_for_bit(tmp_path: Path, text_corpus: Path) -> None:
    """ALGORITHM.md §15: a DiLoCo whose batch ramps with the examples read (its lr and weight decay
    following it, ALGORITHM.md §10), resumed from round 2's checkpoint, runs the same requests and ends with the
    uninterrupted run's model."""
    sets = {
        "algorithm__method": "diloco",
        "batch__schedule": "ramp",
        "batch__schedule_examples": "200",
        "batch__lr_scaling": "sqrt",
        "batch__wd_scaling": "timescale",
    }
    out = tmp_path / "ref"
    assert train(out, text_corpus, batch__max="6", checkpoint__keep="5", **sets) == 0
    ref = only_run(out)
    run = tmp_path / "run"
    shutil.copytree(ref, run)
    assert adloco("train", "--resume", str(run / "checkpoints" / "round-000002")) == 0
    assert weights(run) == weights(ref)

    def requests(r: Path) -> list[tuple[int, int, str]]:
        rows = [json.loads(x) for x in (r / "metrics.jsonl").read_text().splitlines()]
        return sorted({(e["round"], e["request"], e["reason"]) for e in rows if e.get("event") == "trainer"})

    got = requests(ref)
    assert got == requests(run) and {x[2] for x in got} == {"scheduled"}
    assert [x[1] for x in got] == sorted(x[1] for x in got) and got[-1][1] > got[0][1]


def test_a_non_finite_worker_is_left_out(
    tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs"
    poison(monkeypatch, worker=1, rounds=(2, 2))
    assert train(out, text_corpus, algorithm__trainers="4", merge__every="3") == 0
    assert "round 2: worker(s) 1 produced a non-finite loss or update; left out of the outer step" in (
        capsys.readouterr().out
    )
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


def test_persistent_faults_stop_the_run_with_a_usable_checkpoint(
    tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs"
    with monkeypatch.context() as m:
        poison(m, worker=0, rounds=(2, 9))
        assert train(out, text_corpus, faults__max_bad_rounds="2", checkpoint__every="0") == 4
    run = only_run(out)
    assert capsys.readouterr().err.strip().splitlines()[-2:] == [
        "adloco: error: round 3: 2 rounds in a row with a non-finite worker loss or update "
        "(faults.max_bad_rounds); lower inner.lr or inner.clip; checkpoint round-000003 written",
        f"resume with: {program()} train --resume {run} --set inner.lr=...",
    ]
    assert [c.name for c in checkpoint.complete(run)] == ["round-000003"]
    assert adloco("train", "--resume", str(run)) == 0  # the fault is gone: the run finishes
    assert rounds_logged(run) == [1, 2, 3, 4, 5]


@pytest.mark.long
def test_out_of_memory_halves_b_max_and_repeats_the_step(
    tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs"
    out_of_memory(monkeypatch, worker=2, rows=1)  # worker 2 cannot hold a micro-batch of 2 rows
    assert train(out, text_corpus) == 0
    assert "round 1: worker 2 ran out of memory; b_max 2 -> 1" in capsys.readouterr().out
    run = only_run(out)
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    workers = [e for e in events if e["event"] == "worker"]
    assert {e["micro"] for e in workers if e["worker"] == 2} == {1}
    assert {e["micro"] for e in workers if e["worker"] != 2} == {2}
    # the effective batch (what the math sees) is unchanged
    assert {e["examples"] for e in workers if e["round"] == 1} == {6}


@pytest.mark.long
def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(
    tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs"
    with monkeypatch.context() as m:
        disk_full(m, round_=4)
        assert train(out, text_corpus) == 2
    run = only_run(out)
    assert capsys.readouterr().err.strip() == (
        f"adloco: error: checkpoint round-000004: cannot write into {run / 'checkpoints'} (No space left on "
        f"device); the previous checkpoint round-000002 is intact: free space, then resume with: {program()} "
        f"train --resume {run}"
    )
    assert [c.name for c in checkpoint.complete(run)] == ["round-000002"]
    assert not list((run / "checkpoints").glob(".tmp-*"))
    assert adloco("train", "--resume", str(run)) == 0


def test_loading_a_checkpoint_runs_no_code_from_it(
    tmp_path: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DCP's table (.metadata) is a pickle: it is read by an unpickler that builds DCP's metadata classes
    alone. A table altered to run code (and its manifest entry to match) is refused in one line, and the
    code does not run."""
    import hashlib
    import os
    import pickle

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    folder = run / "checkpoints" / "round-000005"
    ran = tmp_path / "RAN"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {ran}",))

    data = pickle.dumps(Evil())
    (folder / ".metadata").write_bytes(data)
    meta = json.loads((folder / "state.json").read_text())
    meta["files"][".metadata"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "state.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert adloco("train", "--resume", str(run)) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"adloco: error: checkpoint '{folder}': .metadata is not DCP's metadata (refused to build "
        f"{os.system.__module__}.system)"
    )
    assert not ran.exists()


@pytest.mark.long
def test_a_checkpoint_written_behind_training_resumes_bit_for_bit(
    tmp_path: Path, text_corpus: Path, reference: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """checkpoint.async_save: the checkpoints of rounds 2 and 4 go through DCP's async_save (the end's is
    waited for); the run and a resume from round 4 end with the uninterrupted run's model."""
    import torch.distributed.checkpoint as dcp

    calls = []
    real = dcp.async_save

    def spy(*a: object, **k: object) -> object:
        calls.append(k.get("storage_writer"))
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(dcp, "async_save", spy)
    out = tmp_path / "async"
    assert train(out, text_corpus, checkpoint__async_save="true") == 0
    run = only_run(out)
    assert len(calls) == 2
    assert weights(run) == weights(reference)
    assert [p.name for p in checkpoint.complete(run)] == ["round-000004", "round-000005"]
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["round"] for e in events if e["event"] == "checkpoint"] == [2, 4, 5]
    assert adloco("train", "--resume", str(run / "checkpoints" / "round-000004")) == 0
    assert weights(run) == weights(reference)


@pytest.mark.long
@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_checkpoints_under_an_fsspec_url_resume_bit_for_bit(
    tmp_path: Path, text_corpus: Path, reference: Path, scheme: str
) -> None:
    """checkpoint.dir as an fsspec URL: each run's checkpoints in <url>/<run name>, none in the run
    directory; --resume RUN_DIR finds them there and ends with the uninterrupted run's model."""
    import fsspec

    url = f"file://{tmp_path / 'store'}" if scheme == "file" else f"memory://{tmp_path.name}/store"
    out = tmp_path / "runs"
    assert train(out, text_corpus, checkpoint__dir=url) == 0
    run = only_run(out)
    assert not (run / "checkpoints").exists()
    found = checkpoint.complete(run, url)
    assert [f.url for f in found] == [f"{url}/{run.name}/round-00000{r}" for r in (4, 5)]
    fs, path = fsspec.core.url_to_fs(found[-1].url)
    fs.rm(path, recursive=True)  # the newest gone: the run continues from round 4
    assert adloco("train", "--resume", str(run)) == 0
    assert weights(run) == weights(reference)
    assert [f.name for f in checkpoint.complete(run, url)] == ["round-000004", "round-000005"]


def test_a_run_made_before_a_key_was_added_resumes_with_the_value_it_ran_with(tmp_path: Path) -> None:
    """``batch.noise_rows`` came with the default ``probed`` and then became null (requested): a run
    directory whose config.yaml lacks it ran as ``probed`` and resumes so; the same file as a new run's
    --config takes today's default, and a value the run's file names is kept."""
    import yaml

    from adloco.config import dump_yaml, resolve

    old = yaml.safe_load(dump_yaml(resolve()))
    del old["batch"]["noise_rows"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    assert resolve(path, resuming=True).batch.noise_rows == "probed"
    assert resolve(path).batch.noise_rows is None
    assert resolve(path, ["batch.noise_rows=requested"], resuming=True).batch.noise_rows == "requested"
    old["batch"]["noise_rows"] = None
    path.write_text(yaml.safe_dump(old))
    assert resolve(path, resuming=True).batch.noise_rows is None


def test_a_checkpoint_from_before_a_key_was_added_holds_the_run_to_the_value_it_ran_with() -> None:
    """The checkpoint's config of a run made before ``batch.noise_rows`` lacks it: the run ran as
    ``probed``, so --resume may not switch it to ``requested`` (not a key a resumed run may change), and a
    checkpoint read for analysis (:func:`adloco.config.load.as_it_ran`) reads ``probed`` too."""
    from types import SimpleNamespace

    from adloco.config import resolve
    from adloco.config.load import as_it_ran
    from adloco.engine.rundir import check_resumable
    from adloco.errors import UserError

    saved = resolve().to_dict()
    del saved["batch"]["noise_rows"]
    ck = SimpleNamespace(meta={"config": saved}, path=Path("ck"), round=1)
    check_resumable(resolve(None, ["batch.noise_rows=probed"]), ck)  # type: ignore[arg-type]
    with pytest.raises(
        UserError, match=r"^--resume: batch\.noise_rows = 'requested' differs from the checkpoint's 'probed'"
    ):
        check_resumable(resolve(None, ["batch.noise_rows=requested"]), ck)  # type: ignore[arg-type]
    with pytest.raises(
        UserError, match=r"^--resume: batch\.noise_rows = None differs from the checkpoint's 'probed'"
    ):
        check_resumable(resolve(), ck)  # type: ignore[arg-type]
    assert resolve(base=as_it_ran(saved)).batch.noise_rows == "probed"
