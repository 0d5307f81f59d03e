"""What runs on CUDA and nowhere else: Muon's steps, checkpoints through torch.distributed.checkpoint (a
one-rank NCCL group), the sparse codec, compiled blocks with torch's compile caches, and the default
choice of CUDA graphs, each through its public face. Every test here skips without CUDA; on a GPU machine
``pytest -k cuda tests/unit`` runs them with the other CUDA tests (each has ``cuda`` in its name or its
module's)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.helpers import run_main, train_once, train_with_output

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def tiny_run(corpus: Path, **extra: str) -> dict[str, str]:
    """A few-second llama-micro run on the test corpus, with ``extra`` settings."""
    return {
        "data.source": str(corpus),
        "model.name": "llama-micro",
        "data.tokenizer": "bpe:300",
        "data.seq_len": "16",
        "algorithm.rounds": "2",
        "algorithm.inner_steps": "3",
        "algorithm.workers": "2",
        "algorithm.trainers": "2",
        "eval.max_examples": "4",
        "logging.progress": "plain",
        "logging.plots": "false",
        "logging.save_model": "false",
        **{k.replace("__", "."): v for k, v in extra.items()},
    }


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


# -- CUDA graphs by default ----------------------------------------------------------------------------


@needs_cuda
def test_on_cuda_the_default_run_captures_its_workers_and_says_so(tmp_path: Path, text_corpus: Path) -> None:
    run, out = train_with_output(tmp_path, tiny_run(text_corpus, model__precision="bf16"))
    assert out.splitlines()[0] == "cuda graphs: on (auto: CUDA, 2 workers on one device)"
    assert "could not be captured" not in out
    assert math.isfinite(summary(run)["final_val_loss"])


# -- Muon ------------------------------------------------------------------------------------------------


@needs_cuda
def test_cuda_muon_steps_as_on_the_cpu() -> None:
    """DiLoCo with Muon on two workers, on CUDA and on the CPU from the same start and batches: θ ends
    where the CPU's does, up to the arithmetic of Newton–Schulz (bfloat16 on the GPU; ``auto`` on a CPU
    that emulates bfloat16, float32: a small share of how far it moved), and Muon's state lives on the GPU (its step counters are 0-dim tensors on the host, as
    torch's optimizers keep them unless capturable)."""
    from tests.toy_lm import muon_diloco, run, tiny

    def trained(device: str) -> tuple[torch.Tensor, torch.Tensor, object]:
        ms = [m.to(device) for m in tiny(2)]
        algo = muon_diloco(ms)
        start = algo.theta(0).detach().cpu().clone()
        run(algo, 2)
        return start, algo.theta(0).detach().cpu(), algo

    start, on_cpu, _ = trained("cpu")
    start_gpu, on_gpu, algo = trained("cuda")
    assert torch.equal(start, start_gpu)
    moved = (on_cpu - start).norm()
    assert moved > 0 and (on_gpu - on_cpu).norm() < 0.05 * moved
    rep = next(iter(algo.replicas.values()))  # type: ignore[attr-defined]
    states = [v for o in rep.optimizer.optimizers for s in o.state.values() for v in s.values()]
    buffers = [t for t in states if isinstance(t, torch.Tensor) and t.dim() > 0]
    assert buffers and all(t.device.type == "cuda" for t in buffers)


@needs_cuda
def test_cuda_adloco_train_with_muon_captures_its_workers_as_without_graphs(
    tmp_path: Path, text_corpus: Path
) -> None:
    """Muon inside CUDA graphs (its lr a device tensor, adloco.library.optim.Muon): auto turns them on, the
    run trains, and it ends where the same run without graphs ends, within the float tolerance of fused
    against foreach AdamW on the embeddings and head (float32 Newton–Schulz: bfloat16's rounding would
    hide a wrong step less well)."""
    # DiLoCo: no batch test whose discrete decisions a float-level difference could flip
    sets = {"inner__optimizer": "muon", "inner__muon_ns_dtype": "float32", "algorithm__method": "diloco"}
    run, out = train_with_output(tmp_path / "graphs", tiny_run(text_corpus, **sets))
    assert out.splitlines()[0] == "cuda graphs: on (auto: CUDA, 2 workers on one device)"
    assert "could not be captured" not in out  # a failed capture runs eagerly: it would equal the eager run
    eager = train_once(tmp_path / "eager", tiny_run(text_corpus, runtime__cuda_graphs="false", **sets))
    s, e = summary(run), summary(eager)
    assert math.isfinite(s["final_val_loss"]) and s["final_val_ppl"] < s["initial_val_ppl"]
    assert s["final_val_loss"] == pytest.approx(e["final_val_loss"], rel=2e-3)


# -- DCP checkpoints --------------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.skipif(CUDA and not torch.distributed.is_nccl_available(), reason="needs NCCL")
def test_cuda_dcp_checkpoint_through_a_one_rank_nccl_group(tmp_path: Path) -> None:
    """A checkpoint's CUDA tensors and pieces written and read back through torch.distributed.checkpoint
    in a one-rank NCCL process group: over the NCCL group itself, on the caller's thread; and behind it
    (staged into host memory) over a gloo group of its own, as ``adloco train`` writes under NCCL
    (:func:`adloco.engine.checkpoint.state.group_for`)."""
    import torch.distributed as dist

    from adloco.engine.checkpoint import storage

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dev = torch.device("cuda", torch.cuda.current_device())
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=dev)
    try:
        assert dist.get_backend() == "nccl"
        groups = {"nccl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
        whole = torch.randn(4099, device=dev)
        saved = whole.clone()
        pieces = storage.Pieces(4099, [(whole[:1000].clone(), 0), (whole[1000:].clone(), 1000)])
        for name, background in (("nccl", False), ("gloo", True)):
            where = str(tmp_path / f"ck-{name}")
            state = {"theta": whole, "pieces": pieces, "step": torch.tensor([3.0], device=dev)}
            done = storage.write(state, where, groups[name], background)
            if background:
                assert done is not None
                whole.fill_(7.0)  # the next round changes the original: the staged copy is what is written
                done.result()
                whole.copy_(saved)
            got = {
                "theta": torch.zeros_like(whole),
                "step": torch.zeros(1, device=dev),
                "pieces": storage.Pieces(4099, [(torch.zeros(4099, device=dev), 0)]),
            }
            storage.read(got, where, groups[name])
            assert torch.equal(got["theta"], saved) and got["theta"].device.type == "cuda", name
            assert torch.equal(got["pieces"].parts[0][0], saved), name  # two pieces read as one
            assert float(got["step"]) == 3.0, name
    finally:
        dist.destroy_process_group()


@needs_cuda
def test_cuda_run_checkpoints_and_resumes(tmp_path: Path, text_corpus: Path) -> None:
    """adloco train on CUDA writes its DCP checkpoints every round and continues from one."""
    run = train_once(tmp_path, tiny_run(text_corpus, checkpoint__every="1", model__precision="bf16"))
    assert (run / "checkpoints" / "round-000002" / "state.json").is_file()
    ran = run_main("train", "--resume", str(run), "--set", "algorithm.rounds=3")
    assert ran.returncode == 0, ran.stderr
    s = summary(run)
    assert s["rounds"] == 3 and math.isfinite(s["final_val_loss"])


# -- the sparse codec -----------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("numel", [1, 255, 4096, 100_003])
def test_cuda_topk_round_trips_as_on_the_cpu(numel: int) -> None:
    """comm.dtype topk through the codec's public face on CUDA: exactly nbytes bytes, the CPU's bytes (a
    codec's encoding is a function of the values alone, on any device), and the CPU's decoding bit for bit."""
    from adloco.library.comm.compressed import codec

    c = codec("topk")
    assert c is not None
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    on_cpu, on_gpu = c.encode(x), c.encode(x.cuda())
    assert on_gpu.device.type == "cuda" and on_gpu.numel() == c.nbytes(numel)
    assert torch.equal(on_gpu.cpu(), on_cpu)
    back = c.decode(on_gpu, numel)
    assert back.device.type == "cuda" and torch.equal(back.cpu(), c.decode(on_cpu, numel))


@needs_cuda
def test_cuda_adloco_train_with_the_sparse_codec(tmp_path: Path, text_corpus: Path) -> None:
    run = train_once(tmp_path, tiny_run(text_corpus, comm__dtype="topk", algorithm__rounds="3"))
    s = summary(run)
    assert math.isfinite(s["final_val_loss"]) and s["final_val_ppl"] < s["initial_val_ppl"]
    events = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(e["bytes"] for e in events if e.get("event") == "round") > 0


# -- compiled blocks and their caches -------------------------------------------------------------------


@needs_cuda
def test_cuda_compiled_blocks_reuse_the_compile_cache(
    tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runtime.compile with inductor on CUDA, blocks compiled and workers captured: the first run fills the
    cache folder, a second (torch's in-memory caches dropped, as in a new process) finds its graphs there."""
    from adloco.engine.compiling import ENV

    monkeypatch.delenv(ENV, raising=False)
    settings = tiny_run(
        text_corpus,
        runtime__compile="true",
        runtime__compile_cache=str(tmp_path / "cache"),
        algorithm__method="diloco",
        model__precision="bf16",
    )
    torch._dynamo.reset()
    first, out = train_with_output(tmp_path / "first", settings)
    assert out.splitlines()[0] == "cuda graphs: on (auto: CUDA, 2 workers on one device)"
    assert "compile: 1 block (LlamaDecoderLayer), each on its own, backend inductor" in out
    assert any((tmp_path / "cache").rglob("*")), "the first run left nothing in the cache folder"
    torch._dynamo.reset()
    second, out2 = train_with_output(tmp_path / "second", settings)
    (line,) = [ln for ln in out2.splitlines() if "FX graph cache" in ln]
    hits = int(line.split("FX graph cache ")[1].split(" hits")[0])
    misses = int(line.split(" hits, ")[1].split(" misses")[0])
    assert hits > 0 and misses == 0, line
    a, b = summary(first), summary(second)
    assert math.isclose(a["final_val_loss"], b["final_val_loss"], rel_tol=1e-3)
