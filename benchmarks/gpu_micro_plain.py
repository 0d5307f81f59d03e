"""Section 6's plain training loops for ``benchmarks/gpu_micro.py``: a ~125M Llama (and the engine's
microllama-300m shape) stepped with AdamW in bf16 autocast, tokens/s and model FLOPs utilization
(``flops_per_token``, ``plain_loop``, ``overhead``), and the same loop compiled by blocks or whole for the
compile section (``compile_plain``). Standalone PyTorch, never adloco.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch
from gpu_micro_models import Save, _adamw, _device, _err, _free, _sync, hf_llama, n_params
from torch import nn

H100_DENSE_BF16 = 989e12  # datasheet, dense (no sparsity), SXM

GPT_125M = dict(vocab=32000, hidden=768, layers=12, heads=12, inter=2048, tied=False)
MICROLLAMA_4K = dict(vocab=4096, hidden=1024, layers=12, heads=16, kv_heads=4, inter=5632, tied=False)
TINY_125M = dict(vocab=256, hidden=64, layers=2, heads=4, inter=128, tied=False)  # dry run


def flops_per_token(model: nn.Module, shape: dict[str, Any], seq: int) -> tuple[float, int]:
    """(6·N + 12·L·H·T, N): N counts every matrix the tokens go through (the output head, not the input
    embedding lookup); the attention term is PaLM's (scores and values, forward and backward, no causal
    discount)."""
    total = n_params(model)
    emb = shape["vocab"] * shape["hidden"]
    n = total - emb if not shape.get("tied", True) else total
    return 6 * n + 12 * shape["layers"] * shape["hidden"] * seq, n


def plain_loop(
    shape: dict[str, Any],
    seq: int,
    batch: int,
    attn: str,
    fused: bool,
    compiled: bool,
    steps: int,
    warmup: int,
    ceiling: float,
    dev: torch.device,
) -> dict[str, Any]:
    """AdamW steps with bf16 autocast (fp32 parameters and optimizer), clip 1.0, random tokens."""
    torch.manual_seed(0)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    model = hf_llama(shape, seq, attn).to(dev)
    fpt, n = flops_per_token(model, shape, seq)
    opt = (
        _adamw(list(model.parameters()), fused=True)
        if fused
        else _adamw(list(model.parameters()), foreach=True)
    )
    fwd = torch.compile(model) if compiled else model
    g = torch.Generator(device=dev).manual_seed(1)
    data = [torch.randint(0, shape["vocab"], (batch, seq), device=dev, generator=g) for _ in range(2)]
    amp = dev.type == "cuda"

    def step(i: int) -> torch.Tensor:
        ids = data[i % 2]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            loss = fwd(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    t0 = time.perf_counter()
    for i in range(warmup):
        step(i)
    _sync(dev)
    warm_s = time.perf_counter() - t0
    if dev.type == "cuda":
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for i in range(steps):
            loss = step(i)
        e.record()
        e.synchronize()
        dt = s.elapsed_time(e) / 1e3
    else:
        t0 = time.perf_counter()
        for i in range(steps):
            loss = step(i)
        dt = time.perf_counter() - t0
    tokens = steps * batch * seq
    tps = tokens / dt
    out = {
        "params": n_params(model),
        "params_counted": n,
        "flops_per_token": fpt,
        "batch": batch,
        "seq": seq,
        "step_ms": round(dt / steps * 1e3, 2),
        "tokens_per_s": round(tps),
        "tflops": round(tps * fpt / 1e12, 1),
        "mfu_measured": round(tps * fpt / ceiling, 4) if ceiling else None,
        "mfu_datasheet": round(tps * fpt / H100_DENSE_BF16, 4),
        "warmup_s": round(warm_s, 1),
        "loss": round(float(loss), 4),
        "finite": bool(math.isfinite(float(loss))),
        "peak_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 1) if dev.type == "cuda" else None,
    }
    return out


def overhead(dry: bool, ceiling_tflops: float | None, save: Save) -> dict[str, Any]:
    """Section 6's plain loops; torch.compile last (it is the slow one to warm up)."""
    dev = _device()
    ceiling = (ceiling_tflops or 0.0) * 1e12
    shape, seq, batch = (TINY_125M, 32, 2) if dry else (GPT_125M, 1024, 32)
    steps, warmup = (1, 1) if dry else (10, 3)
    variants = [
        # the engine's own shape first: the one the engine is compared with
        (
            "engine shape (microllama-300m, vocab 4096), sdpa, AdamW foreach",
            dict(attn="sdpa", fused=False, compiled=False, engine=True),
        ),
        ("eager attention, AdamW foreach", dict(attn="eager", fused=False, compiled=False)),
        ("sdpa, AdamW foreach", dict(attn="sdpa", fused=False, compiled=False)),
        ("sdpa, AdamW fused", dict(attn="sdpa", fused=True, compiled=False)),
        ("sdpa, AdamW fused, torch.compile", dict(attn="sdpa", fused=True, compiled=True)),
    ]
    out: dict[str, Any] = {
        "shape": shape,
        "seq": seq,
        "ceiling_tflops_measured": ceiling_tflops,
        "ceiling_tflops_datasheet": H100_DENSE_BF16 / 1e12,
        "precision": "bf16 autocast, fp32 parameters and AdamW state" if dev.type == "cuda" else "fp32 (CPU)",
        "variants": {},
    }
    for name, v in variants:
        if dry and (v.get("compiled") or name.startswith(("eager", "sdpa, AdamW foreach"))):
            out["variants"][name] = {"skipped": "dry run"}
            save(out)
            continue
        sh, b = shape, batch
        if v.get("engine"):
            sh, b = (TINY_125M, 2) if dry else (MICROLLAMA_4K, 16)
        res: dict[str, Any] = {}
        while True:
            try:
                res = plain_loop(
                    sh, seq, b, v["attn"], v["fused"], v["compiled"], steps, warmup, ceiling, dev
                )
                _free(dev)
                break
            except torch.OutOfMemoryError as exc:
                _free(dev)
                if b <= 1:
                    res = {"error": _err(exc)}
                    break
                res.setdefault("oom_at_batch", []).append(b)
                b //= 2
            except Exception as exc:  # noqa: BLE001 - one variant failing must not stop the others
                res = {"error": _err(exc)}
                _free(dev)
                break
        out["variants"][name] = res
        save(out)
    return out


def compile_plain(
    dry: bool, ceiling_tflops: float | None, save: Save, scope: str, backend: str
) -> dict[str, Any]:
    """The plain loop at the engine's overhead shape (microllama-300m with a 4,096-token vocabulary, 16 x
    1,024 tokens, bf16 autocast, AdamW foreach, clip 1.0), compiled as the engine compiles it: each
    decoder layer on its own (``scope`` ``blocks``, ``nn.Module.compile`` in place) or the whole model
    (``model``). The first step pays for compilation (into whatever cache folder this process was
    given: a fresh one is a cold cache); compile seconds = the first step's time minus a warm step's.
    Then tokens/s and MFU of warm steps."""
    dev = _device()
    shape, seq, batch = (TINY_125M, 32, 2) if dry else (MICROLLAMA_4K, 1024, 16)
    steps = 2 if dry else 10
    ceiling = (ceiling_tflops or 0.0) * 1e12
    torch.manual_seed(0)
    model = hf_llama(shape, seq, "sdpa").to(dev)
    fpt, n = flops_per_token(model, shape, seq)
    opt = _adamw(list(model.parameters()), foreach=True)
    parts = list(model.model.layers) if scope == "blocks" else [model]
    for part in parts:
        part.compile(backend=backend)
    g = torch.Generator(device=dev).manual_seed(1)
    data = [torch.randint(0, shape["vocab"], (batch, seq), device=dev, generator=g) for _ in range(2)]
    amp = dev.type == "cuda"
    out: dict[str, Any] = {
        "scope": scope,
        "backend": backend,
        "compiled": f"{len(parts)} LlamaDecoderLayer, each on its own"
        if scope == "blocks"
        else "the whole model",
        "shape": shape,
        "seq": seq,
        "batch": batch,
        "params": n_params(model),
        "flops_per_token": fpt,
        "params_counted": n,
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
    }

    def step(i: int) -> torch.Tensor:
        ids = data[i % 2]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    _sync(dev)
    t0 = time.perf_counter()
    step(0)
    _sync(dev)
    out["first_step_s"] = round(time.perf_counter() - t0, 2)
    save(out)
    step(1)  # the second input (the same shape: no recompilation)
    _sync(dev)
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(i)
    _sync(dev)
    dt = (time.perf_counter() - t0) / steps
    tps = batch * seq / dt
    out.update(
        step_ms=round(dt * 1e3, 2),
        compile_s=round(out["first_step_s"] - dt, 2),
        tokens_per_s=round(tps),
        tflops=round(tps * fpt / 1e12, 1),
        mfu_measured=round(tps * fpt / ceiling, 4) if ceiling else None,
        mfu_datasheet=round(tps * fpt / H100_DENSE_BF16, 4),
        loss=round(float(loss), 4),
        peak_gib=round(torch.cuda.max_memory_allocated(dev) / 2**30, 1) if dev.type == "cuda" else None,
    )
    try:
        from torch._dynamo.utils import counters

        out["unique_graphs"] = counters["stats"]["unique_graphs"]
        out["fx_graph_cache"] = {
            "hits": counters["inductor"]["fxgraph_cache_hit"],
            "misses": counters["inductor"]["fxgraph_cache_miss"],
        }
    except Exception as exc:  # noqa: BLE001 - counters are torch's internals
        out["counters"] = _err(exc)
    return out
