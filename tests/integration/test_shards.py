"""Workers that span several processes (runtime.shards, ALGORITHM.md §12): 4 gloo processes as 2 workers x
2 shards, each replica sharded with FSDP2, against 2 unsharded workers. The same run: the
same requests, merges, allocation and bytes every round, the same final model within float32 rounding
(FSDP's reduce-scatter sums the rows' gradients in another order).

One AdLoCo run covers DiLoCo's path too: its two trainers (one worker each) merge at round 2, so rounds 3
and 4 are one trainer of both sharded workers, their Δ averaged and a Nesterov outer step on each shard
(the momentum moved with θ at the merge), as DiLoCo runs every round."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.helpers import TINY_DIST, S, adloco_process, load_run

SHARDED = ["--set", "algorithm.workers=2", "--set", "switch.b_max=4", "--set", "algorithm.rounds=4"]
ADLOCO = [  # two trainers that merge (a move of θ and momentum), the test that needs the shared mean
    "algorithm.trainers=2",
    "merge.every=2",
    "batch.test=augmented_inner_product",
    "batch.vartheta=0.05",
]


def _pair(tmp_path: Path, corpus: Path, extra: list[str]) -> tuple[dict, dict]:
    """The unsharded run in this process (the in-process backend gives the run of 2 gloo processes:
    tests/integration/test_distributed.py), the sharded one as 4 gloo processes."""
    from adloco.cli import main

    common = [*TINY_DIST, *SHARDED, *S(*extra, f"data.source={corpus}")]
    one = ["--set", "runtime.threads=1", "--set", f"logging.out_dir={tmp_path / 'unsharded'}"]
    assert main(["train", *common, *one]) == 0
    p = adloco_process(
        "train",
        "--nproc",
        "4",
        *common,
        "--set",
        "runtime.shards=2",
        "--set",
        f"logging.out_dir={tmp_path / 'sharded'}",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "builds the whole model" not in p.stdout  # each rank started from its own shards only
    return load_run(tmp_path / "unsharded"), load_run(tmp_path / "sharded")


def test_two_workers_of_two_shards_give_the_run_of_two_unsharded_workers(
    tmp_path: Path, text_corpus: Path
) -> None:
    a, b = _pair(tmp_path, text_corpus, ["algorithm.method=adloco", *ADLOCO])
    _same_run(a, b)
    _resumes(tmp_path)


def test_muon_on_workers_of_two_shards_gives_the_unsharded_run(tmp_path: Path, text_corpus: Path) -> None:
    """inner.optimizer muon on sharded workers: the matrices are DTensors, whose products gather each
    matrix, so every shard orthogonalizes the whole of it; the run of unsharded workers within float32
    rounding (the Newton–Schulz iterations in float32: in bfloat16 the two agree to bfloat16's rounding,
    0.3% of a parameter here), and its checkpoint (Muon's momentum, in shards) resumes as AdamW's does."""
    muon = ["inner.optimizer=muon", "inner.muon_ns_dtype=float32"]
    a, b = _pair(tmp_path, text_corpus, ["algorithm.method=adloco", *ADLOCO, *muon])
    _same_run(a, b)
    _resumes(tmp_path)


def _same_run(a: dict, b: dict) -> None:
    assert b["rounds"] == a["rounds"]  # requests and allocation, every round
    assert b["merges"] == a["merges"]
    assert [m[0] for m in a["merges"]] == [2] and a["rounds"][-1][1] != a["rounds"][0][1]  # merged; grew
    assert len(a["rounds"][-1][1]) == 1  # rounds 3 and 4: one trainer of both workers (DiLoCo's shape)
    for key in ("bytes_total", "communications_total", "bytes_by_kind", "examples_total"):
        assert b["summary"][key] == a["summary"][key], key
    assert b["summary"]["final_val_ppl"] == pytest.approx(a["summary"]["final_val_ppl"], rel=1e-4)
    assert b["start"]["processes"] == 4
    for name, ref in a["params"].items():  # the saved model is the whole model, gathered from its shards
        assert b["params"][name].shape == ref.shape
        assert (b["params"][name] - ref).abs().max().item() < 1e-5, name


def _resumes(tmp_path: Path) -> None:
    """The sharded run's checkpoint of round 2 (of 4), resumed: on the same layout (bitwise the
    uninterrupted run: the checkpoint put together from the shards and cut again) and with another k
    (2 -> 1: the checkpoint is in an unsharded run's layout). Left out to keep CI short, each passed in an
    earlier version of this test: the unsharded run's checkpoint resumed sharded (1 -> 2; the same code
    both ways), and one worker of two shards resumed from two (a resize: the whole state is resized as an
    unsharded one, ALGORITHM.md §9.2, tests/unit/test_resize.py, before it is cut into shards as here)."""
    sharded = next((tmp_path / "sharded").iterdir())
    whole = load_file(sharded / "model" / "model.safetensors")
    config = json.loads((sharded / "model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]  # the model's class, not fully_shard's subclass
    for source, nproc, shards, exact in (
        (sharded, "4", "2", True),  # the same layout
        (sharded, None, "1", False),  # k 2 -> 1: 2 unsharded workers in this process
    ):
        run = tmp_path / f"resume-{source.parent.name}-{nproc}-{shards}"
        shutil.copytree(source, run)
        resume = [
            "train",
            "--resume",
            str(run / "checkpoints" / "round-000002"),
            "--set",
            f"runtime.shards={shards}",
        ]
        if nproc is None:
            from adloco.cli import main

            assert main([*resume, "--set", "runtime.backend=inprocess", "--set", "runtime.threads=1"]) == 0
        else:
            p = adloco_process(*resume[:1], "--nproc", nproc, *resume[1:])
            assert p.returncode == 0, p.stderr[-3000:]
        got = load_file(run / "model" / "model.safetensors")
        for name, ref in whole.items():
            diff = (got[name] - ref).abs().max().item()
            assert diff == 0 if exact else diff < 1e-5, (source.parent.name, nproc, shards, name, diff)
