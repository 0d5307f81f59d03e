"""The engine's own step on one GPU, for benchmarks/gpu.py: several workers in one process, stepping one
after another (as without ``runtime.cuda_graphs``) or at once (each worker's step a CUDA graph on its own
stream), and a traced plain PyTorch loop to read beside the engine's ``logging.trace``.

Driven by ``benchmarks/gpu.py`` (section 7, ``multi``; section 6, ``overhead``); not a command of its own.
The workers are the library's (:class:`adloco.DiLoCo` over Hugging Face Llama presets built by
``adloco.models``), fed host batches each step as ``adloco train`` feeds them, so what is timed is the
engine's step path: the batch copy, the replica's step, the round's synchronization.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

Save = Callable[[dict[str, Any]], None]

# preset, seq, rows per worker and step (the engine presets' shapes; the 4096-token vocabulary of the
# stdlib tokenizer)
SHAPES = {"llama-tiny": ("llama-tiny", 128, 8), "llama-10m": ("llama-10m", 256, 16)}
DRY_SHAPES = {"llama-micro": ("llama-micro", 16, 2)}
VOCAB = 4096


def _model(preset: str, seq: int, vocab: int, seed: int, dev: torch.device) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    from adloco.models.sizing import SHAPES as PRESETS

    shape = dict(PRESETS[preset])
    shape["max_position_embeddings"] = max(shape.get("max_position_embeddings", 0), seq)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, use_cache=False, **shape)
    return LlamaForCausalLM(cfg).to(dev).train()


def build(preset: str, seq: int, rows: int, k: int, graphs: bool, dev: torch.device, H: int) -> Any:
    """DiLoCo with k workers in this process, bf16 on CUDA, AdamW (capturable and fused with graphs)."""
    from adloco import DiLoCo
    from adloco.library.comm.inprocess import InProcessComm
    from adloco.library.flat import flatten

    vocab = VOCAB if preset != "llama-micro" else 128
    models = [_model(preset, seq, vocab, 0, dev) for _ in range(k)]
    opts = []
    for m in models:
        flat = flatten(m)
        extra = {"fused": True, "capturable": True} if graphs else {}
        opts.append(torch.optim.AdamW(flat.groups, lr=1e-3, **extra))
    return DiLoCo(
        models,
        opts,
        inner_steps=H,
        comm=InProcessComm(k),
        batch_size=rows,
        precision="bf16" if dev.type == "cuda" else "fp32",
        cuda_graphs=graphs,
        sync_initial=False,
    ), vocab


def _batches(algo: Any, vocab: int, seq: int, g: torch.Generator) -> dict[int, dict[str, torch.Tensor]]:
    out = {}
    for w in algo.local_workers:
        x = torch.randint(0, vocab, (algo.batch_size(w), seq), generator=g)
        out[w] = {"input_ids": x, "labels": x}  # host tensors: the engine copies them each step
    return out


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(
    preset: str, seq: int, rows: int, k: int, graphs: bool, dev: torch.device, rounds: int, H: int
) -> dict[str, Any]:
    """Examples per second over ``rounds`` rounds of H steps, after one warm-up round (allocations,
    kernel choice, and with graphs the eager first step and the capture); the median round."""
    algo, vocab = build(preset, seq, rows, k, graphs, dev, H)
    g = torch.Generator().manual_seed(1)
    pool = [_batches(algo, vocab, seq, g) for _ in range(4)]
    for h in range(H):  # warm-up round
        algo.step_all(pool[h % 4])
    times = []
    for _ in range(rounds):
        _sync(dev)
        t0 = time.perf_counter()
        for h in range(H):
            algo.step_all(pool[h % 4])
        _sync(dev)
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    out: dict[str, Any] = {
        "examples_per_s": round(k * rows * H / dt, 1),
        "tokens_per_s": round(k * rows * H * seq / dt),
        "round_s": round(dt, 4),
        "loss": round(float(algo.last_report.loss), 4) if algo.last_report else None,
    }
    if graphs:
        reps = list(algo.replicas.values())
        out["captures"] = [r.graphed.captures for r in reps]
        out["replays"] = [r.graphed.replays for r in reps]
        failed = [r.graphed.failed for r in reps if r.graphed.failed]
        if failed:
            out["capture_failed"] = failed[0]
    return out


def check(preset: str, seq: int, rows: int, dev: torch.device) -> dict[str, Any]:
    """Two workers for two rounds with graphs against without, from the same start and batches: the
    relative difference of the trainer's θ (the optimizer differs: capturable+fused against foreach)."""
    H = 4
    thetas = []
    for graphs in (False, True):
        algo, vocab = build(preset, seq, rows, 2, graphs, dev, H)
        g = torch.Generator().manual_seed(2)
        for _ in range(2 * H):
            algo.step_all(_batches(algo, vocab, seq, g))
        thetas.append(algo.theta(0).float().clone())
    a, b = thetas
    return {"theta_rel_diff": float((a - b).norm() / b.norm())}


def multi(dry: bool, save: Save, deadline: float) -> dict[str, Any]:
    """Section 7's engine part: k = 1, 2, 4 workers of llama-tiny and llama-10m, sequential and at once."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.type == "cuda"
    shapes = DRY_SHAPES if dry else SHAPES
    ks = [1, 2] if dry else [1, 2, 4]
    rounds, H = (1, 3) if dry else (3, 10)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "precision": "bf16 autocast" if cuda else "fp32",
        "ks": ks,
        "what": "DiLoCo in one process, k workers, H steps a round; examples/s of the median timed round",
        "shapes": {},
    }
    first = next(iter(shapes.values()))
    if cuda:
        try:
            out["check"] = check(*first, dev)
        except Exception as exc:  # noqa: BLE001 - reported, the timings still run
            out["check"] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    else:
        out["check"] = {"skipped": "CUDA only"}
    save(out)
    names = list(shapes)
    for i, name in enumerate(names):
        preset, seq, rows = shapes[name]
        share = time.time() + (deadline - time.time()) / (len(names) - i)
        rec: dict[str, Any] = {"seq": seq, "rows": rows, "sequential": {}, "graphs": {}}
        out["shapes"][name] = rec
        for mode in ("sequential", "graphs"):
            for k in ks:
                if time.time() > share:
                    rec[mode][str(k)] = {"skipped": "section time limit"}
                    continue
                if mode == "graphs" and not cuda:
                    rec[mode][str(k)] = {"skipped": "CUDA only"}
                    continue
                try:
                    rec[mode][str(k)] = measure(preset, seq, rows, k, mode == "graphs", dev, rounds, H)
                except Exception as exc:  # noqa: BLE001 - one failing must not stop the rest
                    rec[mode][str(k)] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
                if cuda:
                    torch.cuda.empty_cache()
                base = rec["sequential"].get("1", {}).get("examples_per_s")
                for m in ("sequential", "graphs"):
                    for r in rec[m].values():
                        if base and "examples_per_s" in r:
                            r["vs_one_sequential"] = round(r["examples_per_s"] / base, 2)
                save(out)
    return out


def plain_trace(dry: bool, save: Save) -> dict[str, Any]:
    """Section 6's plain loop under torch.profiler, at the engine's overhead shape (microllama-300m, vocab
    4096, 16 x 1024, bf16 autocast, AdamW foreach, clip 1.0), host batches copied each step as the engine
    does: the summary ``logging.trace`` writes for the engine, for this loop."""
    from adloco.telemetry.trace import profiled

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    preset, seq, rows, vocab = ("llama-micro", 32, 2, 128) if dry else ("microllama-300m", 1024, 16, VOCAB)
    model = _model(preset, seq, vocab, 0, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, vocab, (rows, seq), generator=g) for _ in range(2)]
    amp = dev.type == "cuda"

    def step(i: int) -> None:
        x = data[i % 2].to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    n = 2 if dry else 10
    for i in range(3):
        step(i)
    with profiled(n, dev) as rec:
        for i in range(n):
            step(i)
    out = {"shape": preset, "seq": seq, "rows": rows, "summary": rec.summary}
    out["tokens_per_s"] = round(n * rows * seq / rec.wall_s) if rec.wall_s else None
    save(out)
    assert math.isfinite(out["summary"]["wall_ms_per_step"])
    return out
