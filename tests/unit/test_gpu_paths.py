"""The GPU paths (ALGORITHM.md §14), on the CPU where they can run, and on CUDA where they cannot.

A captured step (``cuda_graphs``) is checked here with its capture emulated: the same input buffers,
device learning rates and recapture rules, with the body called where a graph would be replayed. The
capture itself needs CUDA: those tests skip on a CPU and run on a GPU machine. ``runtime.compile`` runs
with the ``aot_eager`` backend (tracing and AOT autograd without code generation: seconds, not minutes).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from adloco import DiLoCo, RoundAborted
from adloco.engine.evaluation import evaluate
from adloco.library.comm.inprocess import InProcessComm
from adloco.library.graphs import GraphedStep, capturable
from adloco.library.replica import Replica
from adloco.library.snapshot import InnerSnapshot
from tests.helpers import synthetic_data, train_once, train_with_output

CUDA = torch.cuda.is_available()


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 6))


def mse(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return ((model(batch["x"]) - batch["y"]) ** 2).mean()


def batch(rows: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 6, generator=g)
    return {"x": x, "y": torch.sin(x)}


def adamw(model: nn.Module, device_lr: bool = True) -> torch.optim.Optimizer:
    kw = {"fused": True, "capturable": True} if device_lr else {}
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, **kw)


def emulated(rep: Replica) -> GraphedStep:
    """The replica's captured step, capture emulated (the body runs where a replay would)."""
    rep.graphed = GraphedStep(rep._step_body, rep._state_key, rep.device, capture=False)
    return rep.graphed


def steps(rep: Replica, plan: list[tuple[int, float, int]], first: int = 0) -> list[float]:
    """Run (rows, lr, micro) steps through Replica.step, each on a batch of its own (seeds from
    ``first``); returns the losses."""
    out = []
    scratch = torch.zeros(rep.flat.numel)
    for i, (rows, lr, micro) in enumerate(plan):
        for g in rep.optimizer.param_groups:
            g["lr"] = lr
        loss, _ = rep.step(batch(rows, first + i), rows, micro, None, scratch)
        out.append(float(loss))
    return out


def test_a_captured_step_is_the_eager_step_and_reads_each_steps_lr_and_batch() -> None:
    plan = [(8, 1e-2, 8), (8, 5e-3, 8), (8, 2e-2, 4), (8, 0.0, 4), (8, 1e-2, 4), (8, 1e-3, 4)]
    a_model = mlp(0)
    a = Replica(a_model, adamw(a_model), mse, clip=0.5)
    g = emulated(a)
    b_model = mlp(0)
    b = Replica(b_model, adamw(b_model), mse, clip=0.5)  # the same optimizer, no graph
    before_zero_lr: torch.Tensor | None = None
    la, lb = [], []
    for i, step in enumerate(plan):
        if step[1] == 0.0:
            before_zero_lr = a.flat.param.clone()
        la += steps(a, [step], first=i)  # a new batch every step: a stale input buffer would show
        lb += steps(b, [step], first=i)
        if step[1] == 0.0:  # a replay with lr 0: weight decay and Adam both scale by lr, so nothing moves
            assert before_zero_lr is not None and torch.equal(a.flat.param, before_zero_lr)
    # layouts: (8 rows, micro 8) eager, captured; (8, micro 4) eager, captured, then replayed
    assert (g.captures, g.replays) == (2, 4)
    # the graph's lr is a float32 tensor, the eager step's a Python float: within float tolerance
    torch.testing.assert_close(a.flat.param, b.flat.param, rtol=1e-5, atol=1e-6)
    assert np.allclose(la, lb, rtol=1e-5)


def test_a_captured_muon_step_is_the_eager_step_and_reads_each_steps_lr() -> None:
    """Muon with AdamW beside it (``muon_adamw(..., capturable=True)``), as the run builds it under
    ``runtime.cuda_graphs``: captured (emulated), its lr a device tensor each step, against the same pair
    stepped eagerly at the Python float: within float tolerance; at lr 0 nothing moves (both parts'
    weight decay scales by the lr)."""
    from adloco.library.optim import muon_adamw

    plan = [(8, 1e-2, 8), (8, 5e-3, 8), (8, 2e-2, 4), (8, 0.0, 4), (8, 1e-2, 4), (8, 1e-3, 4)]
    reps = []
    for _ in range(2):
        model = mlp(6)
        reps.append(Replica(model, muon_adamw(model, 1e-2, ns_dtype="float32", capturable=True), mse))
    a, b = reps
    g = emulated(a)
    for i, step in enumerate(plan):
        before = a.flat.param.clone()
        la, lb = steps(a, [step], first=i), steps(b, [step], first=i)
        assert np.allclose(la, lb, rtol=1e-5)
        if step[1] == 0.0:
            assert torch.equal(a.flat.param, before)
    assert (g.captures, g.replays) == (2, 4)
    torch.testing.assert_close(a.flat.param, b.flat.param, rtol=1e-5, atol=1e-6)


def test_a_new_layout_or_reset_state_is_captured_again() -> None:
    m = mlp(1)
    rep = Replica(m, adamw(m), mse)
    g = emulated(rep)
    steps(rep, [(4, 1e-2, 4)] * 3)
    assert (g.captures, g.replays) == (1, 2)
    rep.reset_optimizer()  # a worker that moves to another trainer: new state tensors
    steps(rep, [(4, 1e-2, 4)] * 2)
    assert (g.captures, g.replays) == (2, 3)  # one eager step (state created again), then captured
    steps(rep, [(6, 1e-2, 4)] * 2)  # another batch size: eager, then captured
    assert (g.captures, g.replays) == (3, 4)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_workers_at_once_give_the_run_without_graphs(tmp_path: Path, optimizer: str) -> None:
    """DiLoCo with two workers in one process, three rounds with a snapshot each: the emulated graphs
    against no graphs, with the same (capturable, fused) optimizer: equal within float tolerance. Muon
    beside AdamW as ``inner.optimizer: muon`` builds it under graphs (float32 iterations)."""
    from adloco.library.optim import muon_adamw

    def make(model: nn.Module) -> torch.optim.Optimizer:
        if optimizer == "muon":
            return muon_adamw(model, 1e-2, ns_dtype="float32", capturable=True)
        return adamw(model)

    def run(graphs: bool) -> torch.Tensor:
        models = [mlp(2), mlp(2)]
        algo = DiLoCo(
            models,
            [make(m) for m in models],
            inner_steps=4,
            comm=InProcessComm(2),
            loss_fn=mse,
            batch_size=8,
            snapshot=True,
        )
        if graphs:
            for rep in algo.replicas.values():
                emulated(rep)
        for r in range(3):
            for h in range(4):
                algo.step_all({w: batch(8, 100 * r + 10 * h + w) for w in algo.local_workers})
        if graphs:
            got = [
                (rep.graphed.captures, rep.graphed.replays) for rep in algo.replicas.values() if rep.graphed
            ]
            assert got == [(1, 3 * 4 - 1)] * 2, got  # the first step eager, every later one replayed
        return algo.theta(0).clone()

    torch.testing.assert_close(run(True), run(False), rtol=1e-5, atol=1e-6)


def test_a_stopped_round_is_undone_from_its_snapshot() -> None:
    models = [mlp(3), mlp(3)]
    algo = DiLoCo(
        models,
        [adamw(m, False) for m in models],
        inner_steps=3,
        comm=InProcessComm(2),
        loss_fn=mse,
        batch_size=4,
        snapshot=True,
    )
    for h in range(3):
        algo.step_all({w: batch(4, h + w) for w in algo.local_workers})
    start = {w: {k: v.clone() for k, v in rep.inner_state().items()} for w, rep in algo.replicas.items()}
    algo.step_all({w: batch(4, 7 + w) for w in algo.local_workers})
    with pytest.raises(RoundAborted):
        algo.step_all({w: batch(4, 9 + w) for w in algo.local_workers}, stop=True)
    for w, rep in algo.replicas.items():
        now = rep.inner_state()
        assert set(now) == set(start[w]) and all(torch.equal(now[k], start[w][k]) for k in now)
        assert torch.equal(rep.flat.param, algo.theta(0))


def test_a_snapshot_keeps_its_buffers_between_rounds() -> None:
    m = mlp(4)
    opt = adamw(m, False)
    rep = Replica(m, opt, mse)
    snap = InnerSnapshot()
    rep.snapshot(snap)
    assert snap.empty  # before the first step: nothing to copy, a restore clears the state
    steps(rep, [(4, 1e-2, 4)])
    rep.snapshot(snap)
    buffers = [id(v) for h in snap._host for v in h.values()]
    # one host allocation for the whole state, not one per tensor (pinning is paid per allocation)
    assert len({v.untyped_storage().data_ptr() for h in snap._host for v in h.values()}) == 1
    saved = {k: v.clone() for k, v in rep.inner_state().items()}
    steps(rep, [(4, 1e-2, 4)] * 2)
    rep.restore(snap)
    assert all(torch.equal(rep.inner_state()[k], v) for k, v in saved.items())
    rep.snapshot(snap)
    assert [id(v) for h in snap._host for v in h.values()] == buffers


def test_what_a_captured_step_cannot_take_is_refused_in_one_line() -> None:
    m = mlp(5)
    with pytest.raises(ValueError, match="needs a model on a CUDA device"):
        Replica(m, adamw(m), mse, cuda_graphs=True)
    assert "capturable=True" in (capturable(torch.optim.AdamW(mlp(5).parameters())) or "")
    assert "fused=True" in (capturable(torch.optim.SGD(mlp(5).parameters(), lr=0.1)) or "")
    assert capturable(torch.optim.SGD(mlp(5).parameters(), lr=0.1, fused=True)) is None
    assert capturable(adamw(mlp(5))) is None
    from adloco import DDP

    with pytest.raises(ValueError, match="DDP averages gradients"):
        DDP([mlp(5)], [adamw(mlp(5))], comm=InProcessComm(1), loss_fn=mse, cuda_graphs=True)
    algo = DiLoCo([m], [adamw(m)], comm=InProcessComm(1), loss_fn=mse)
    algo.cuda_graphs = True
    with pytest.raises(ValueError, match="hooked form"), algo:
        pass


def test_evaluation_runs_under_the_runs_precision() -> None:
    from adloco import models
    from tests.helpers import build_fn, tiny_config

    data = synthetic_data(seq_len=8)
    cfg = tiny_config()
    model = build_fn(data, cfg).build(0)
    idx = np.arange(8)
    full = evaluate(model, data.val_batch, idx, 4)
    half = evaluate(model, data.val_batch, idx, 4, amp=torch.bfloat16)
    assert full.loss != half.loss and math.isclose(full.loss, half.loss, rel_tol=0.05)
    assert models is not None


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.mark.long
def test_compile_trains_as_eager_with_the_probe(
    tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adloco train with runtime.compile (AdLoCo: the probe's chunks and the steps are micro-batches of
    several sizes) ends where the eager run ends, within float tolerance, and says what it compiled."""
    from adloco.engine.compiling import ENV

    monkeypatch.delenv(ENV, raising=False)  # the run points it at its cache: put back afterwards
    base = {
        "data.source": str(text_corpus),
        "model.name": "llama-micro",
        "data.tokenizer": "bpe:300",
        "data.seq_len": "16",
        "algorithm.rounds": "2",
        "algorithm.inner_steps": "2",
        "algorithm.workers": "2",
        "algorithm.trainers": "2",
        "batch.initial": "4",
        "switch.b_max": "4",
        "eval.max_examples": "4",
        "logging.progress": "off",
        "logging.plots": "false",
    }
    from torch._dynamo.utils import counters

    eager = _summary(train_once(tmp_path / "eager", base))
    counters.clear()
    run, out = train_with_output(
        tmp_path / "compiled",
        {
            **base,
            "runtime.compile": "true",
            "runtime.compile_backend": "aot_eager",
            "runtime.compile_cache": str(tmp_path / "cache"),
            "logging.progress": "plain",
        },
    )
    compiled = _summary(run)
    assert counters["stats"]["unique_graphs"] > 0  # the model was compiled (not eager under another name)
    lines = [ln for ln in out.splitlines() if ln.startswith("compile: ")]
    assert lines[0] == (
        "compile: 1 block (LlamaDecoderLayer), each on its own, backend aot_eager, mode default, at the "
        f"first steps; caches in {tmp_path / 'cache'} (runtime.compile_cache)"
    )
    assert lines[1].startswith("compile: ") and lines[1].endswith("(no inductor cache used by this backend)")
    assert compiled["requests_final"] == eager["requests_final"]
    assert math.isclose(compiled["final_val_loss"], eager["final_val_loss"], rel_tol=1e-4)


def _llama(layers: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shape = dict(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, intermediate_size=32)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, num_hidden_layers=layers, use_cache=False, **shape))


def _loss_and_grads(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.long
@pytest.mark.parametrize("scope", ["blocks", "model"])
def test_compile_by_block_or_whole_gives_the_eager_loss_and_gradients(scope: str) -> None:
    """runtime.compile_scope: blocks compiles each decoder layer on its own, and one graph serves all four;
    model compiles the whole model. Either way the loss and every gradient are eager's within float
    tolerance, and the parameters keep their names (the flat buffer and checkpoints see the same model)."""
    from torch._dynamo.utils import counters

    from adloco.engine.compiling import blocks, compile_in_place

    eager, compiled = _llama(4), _llama(4)
    names = [n for n, _ in compiled.named_parameters()]
    torch._dynamo.reset()
    counters.clear()
    what = compile_in_place(compiled, scope, "aot_eager", "default")
    layers = blocks(compiled)
    assert [type(b).__name__ for b in layers] == ["LlamaDecoderLayer"] * 4
    wrapped = [getattr(b, "_compiled_call_impl", None) is not None for b in layers]
    whole = getattr(compiled, "_compiled_call_impl", None) is not None
    if scope == "blocks":
        assert what == "4 blocks (LlamaDecoderLayer), each on its own" and all(wrapped) and not whole
    else:
        assert what == "the whole model" and not any(wrapped) and whole
    assert [n for n, _ in compiled.named_parameters()] == names
    ids = torch.randint(0, 64, (3, 8), generator=torch.Generator().manual_seed(1))
    (le, ge), (lc, gc) = _loss_and_grads(eager, ids), _loss_and_grads(compiled, ids)
    torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-6)
    assert len(gc) == len(ge) == len(names)
    for a, b in zip(gc, ge, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    if scope == "blocks":  # the block's code was traced once, not once per layer
        assert counters["stats"]["unique_graphs"] == 1


def test_a_model_that_names_no_block_is_compiled_whole() -> None:
    from adloco.engine.compiling import compile_in_place

    model = mlp(7)
    what = compile_in_place(model, "blocks", "eager", "default")
    assert what == "the whole model (Sequential names no repeated block in _no_split_modules)"
    assert getattr(model, "_compiled_call_impl", None) is not None


def test_the_compile_caches_go_where_the_config_or_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runtime.compile_cache, else $TORCHINDUCTOR_CACHE_DIR as the user set it, else <adloco cache>/compile;
    the folder torch writes there itself (its default under the temporary directory) is not a choice."""
    import os

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from adloco.engine.compiling import ENV, use_cache
    from tests.helpers import tiny_config

    monkeypatch.setenv("ADLOCO_CACHE", str(tmp_path / "adloco"))
    monkeypatch.delenv(ENV, raising=False)
    cfg = tiny_config("runtime.compile=true")
    assert use_cache(cfg) == f"{tmp_path / 'adloco' / 'compile'} (the adloco cache)"
    assert (
        os.environ[ENV] == str(tmp_path / "adloco" / "compile") and (tmp_path / "adloco" / "compile").is_dir()
    )
    monkeypatch.setenv(ENV, default_cache_dir())  # what torch set itself when it first asked
    assert use_cache(cfg).endswith("(the adloco cache)")
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert use_cache(cfg) == f"{tmp_path / 'mine'} ($TORCHINDUCTOR_CACHE_DIR)"
    own = tiny_config("runtime.compile=true", f"runtime.compile_cache={tmp_path / 'set'}")
    assert use_cache(own) == f"{tmp_path / 'set'} (runtime.compile_cache, over $TORCHINDUCTOR_CACHE_DIR)"
    assert os.environ[ENV] == str(tmp_path / "set")


@pytest.mark.long
def test_a_traced_round_says_where_its_steps_time_went(tmp_path: Path, text_corpus: Path) -> None:
    run = train_once(
        tmp_path,
        {
            "data.source": str(text_corpus),
            "model.name": "llama-micro",
            "data.tokenizer": "bpe:300",
            "data.seq_len": "16",
            "algorithm.rounds": "2",
            "algorithm.inner_steps": "2",
            "batch.initial": "2",
            "switch.b_max": "2",
            "eval.max_examples": "4",
            "logging.progress": "off",
            "logging.plots": "false",
            "logging.trace": "2",
        },
    )
    assert sorted(p.name for p in (run / "trace").iterdir()) == [
        "round-2.json",
        "round-2.md",
        "round-2.summary.json",
    ]
    s = json.loads((run / "trace" / "round-2.summary.json").read_text())
    assert s["steps"] == 2 and s["wall_ms_per_step"] > 0 and s["aten_ops_per_step"] > 0
    # which operators lead by host time depends on the machine's load; that there is a table does not
    assert s["top_by_host"] and all(r["host_ms_per_step"] > 0 for r in s["top_by_host"])
    trace = json.loads((run / "trace" / "round-2.json").read_text())["traceEvents"]  # a Chrome trace
    assert "aten::mm" in {e.get("name") for e in trace}
    assert "Operators by self host time" in (run / "trace" / "round-2.md").read_text()


@pytest.mark.skipif(CUDA, reason="the refusal on a machine without CUDA")
def test_cuda_graphs_without_cuda_is_one_line(tmp_path: Path) -> None:
    from tests.helpers import run_main

    ran = run_main("train", "--set", "runtime.cuda_graphs=true", "--set", f"logging.out_dir={tmp_path}")
    assert ran.returncode == 2 and not any(tmp_path.iterdir())
    assert ran.stderr.strip().splitlines() == [
        "adloco: error: config: runtime.cuda_graphs = True: CUDA graphs need CUDA (this run is on cpu); use auto or false"
    ]


# -- CUDA only -------------------------------------------------------------------------------------


@pytest.mark.skipif(not CUDA, reason="needs CUDA: a CUDA graph is captured")
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_on_cuda_a_captured_step_replays_the_eager_step(optimizer: str) -> None:
    """AdamW, and Muon beside it (its lr a device tensor; float32 iterations, so that bfloat16's rounding
    hides nothing): the captured step is the eager step of the same optimizer."""
    from adloco.library.optim import muon_adamw

    def make(model: nn.Module) -> torch.optim.Optimizer:
        if optimizer == "muon":
            return muon_adamw(model, 1e-2, ns_dtype="float32", capturable=True)
        return adamw(model)

    dev = torch.device("cuda")
    a_model, b_model = mlp(6).to(dev), mlp(6).to(dev)
    a = Replica(a_model, make(a_model), mse, clip=0.5, cuda_graphs=True)
    b = Replica(b_model, make(b_model), mse, clip=0.5)
    scratch = torch.zeros(a.flat.numel, device=dev)
    for i in range(6):
        for rep in (a, b):
            for g in rep.optimizer.param_groups:
                g["lr"] = 1e-2 / (i + 1)
        with a.on_stream():
            a.fork()
            a.step(batch(8, i), 8, 8, None, scratch)
        a.join()
        b.step(batch(8, i), 8, 8, None, scratch)
    torch.cuda.synchronize()
    assert a.graphed is not None and a.graphed.failed is None and a.graphed.replays == 5
    torch.testing.assert_close(a.flat.param, b.flat.param, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not CUDA, reason="needs CUDA: workers captured as CUDA graphs")
def test_on_cuda_adloco_train_with_graphs_runs(tmp_path: Path, text_corpus: Path) -> None:
    run = train_once(
        tmp_path,
        {
            "data.source": str(text_corpus),
            "model.name": "llama-micro",
            "data.tokenizer": "bpe:300",
            "data.seq_len": "16",
            "algorithm.method": "diloco",
            "algorithm.rounds": "2",
            "algorithm.inner_steps": "4",
            "algorithm.workers": "2",
            "runtime.cuda_graphs": "true",
            "model.precision": "bf16",
            "eval.max_examples": "4",
            "logging.progress": "off",
            "logging.plots": "false",
        },
    )
    assert math.isfinite(_summary(run)["final_val_loss"])
