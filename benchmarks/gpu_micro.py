"""Standalone PyTorch measurements for ``benchmarks/gpu.py``: the matmul ceiling, plain training loops on a
~125M Llama, and ways of running several small workers on one GPU. Imports torch (and transformers where a
Hugging Face model is asked for), never adloco, so it measures the hardware and PyTorch, not the engine.

Each entry point takes a ``save(result)`` callback and calls it after every measurement, so a section
stopped at its time limit still leaves what it measured. ``python benchmarks/gpu_micro.py mpworker JSON``
is one process of the multi-process measurement.
"""

from __future__ import annotations

import copy
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

Save = Callable[[dict[str, Any]], None]
H100_DENSE_BF16 = 989e12  # datasheet, dense (no sparsity), SXM


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _free(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"


# --------------------------------------------------------------------------------------------------
# 1. env
# --------------------------------------------------------------------------------------------------


def _matmul_tflops(n: int, dtype: torch.dtype, dev: torch.device, reps: int) -> float:
    """Median TFLOP/s of an n x n x n product on random data (CUDA events on a GPU)."""
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=dev, dtype=dtype, generator=g)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            a @ b
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        else:
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e12


def env(dry: bool, save: Save) -> dict[str, Any]:
    import importlib.util

    dev = _device()
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cuda": dev.type == "cuda",
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "packages": {
            name: (importlib.util.find_spec(name) is not None)
            for name in (
                "transformers",
                "tokenizers",
                "datasets",
                "safetensors",
                "yaml",
                "rich",
                "matplotlib",
            )
        },
    }
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except Exception as exc:  # noqa: BLE001
        out["transformers"] = _err(exc)
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        out.update(
            device=p.name,
            capability=f"{p.major}.{p.minor}",
            memory_gib=round(p.total_memory / 2**30, 2),
            sms=p.multi_processor_count,
            tf32_matmul_default=torch.backends.cuda.matmul.allow_tf32,
        )
        try:
            out["cudnn"] = torch.backends.cudnn.version()
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as exc:  # noqa: BLE001 - a version string is not worth the section
            out["nccl"] = _err(exc)
        try:
            q = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=driver_version,clocks.max.sm,power.limit",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=20,
            )
            out["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
        except Exception as exc:  # noqa: BLE001
            out["nvidia_smi"] = _err(exc)
    else:
        out["device"] = f"cpu ({platform.processor() or platform.machine()})"
    save(out)
    n = 256 if dry else 8192
    reps = 3 if dry else 20
    out["matmul_n"] = n
    out["bf16_tflops"] = round(_matmul_tflops(n, torch.bfloat16, dev, reps), 1)
    save(out)
    torch.backends.cuda.matmul.allow_tf32 = True
    out["tf32_tflops"] = round(_matmul_tflops(n, torch.float32, dev, reps), 1)
    torch.backends.cuda.matmul.allow_tf32 = False
    out["fp32_tflops"] = round(_matmul_tflops(n, torch.float32, dev, max(3, reps // 4)), 1)
    save(out)
    if dev.type == "cuda":
        nbytes = 2**30
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        dst.copy_(src)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            dst.copy_(src)
        e.record()
        e.synchronize()
        out["copy_tb_s"] = round(2 * nbytes * 10 / (s.elapsed_time(e) / 1e3) / 1e12, 2)
        del src, dst
        _free(dev)
    return out


# --------------------------------------------------------------------------------------------------
# Models: Hugging Face Llama (what the engine trains) and a small pure-PyTorch Llama (vmap and graphs)
# --------------------------------------------------------------------------------------------------


def hf_llama(shape: dict[str, Any], seq: int, attn: str | None = None) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape.get("kv_heads", shape["heads"]),
        intermediate_size=shape["inter"],
        max_position_embeddings=max(seq, 128),
        tie_word_embeddings=shape.get("tied", True),
        use_cache=False,
    )
    if attn is not None:
        cfg._attn_implementation = attn  # "sdpa" is the default in transformers 5
    return LlamaForCausalLM(cfg)


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Block(nn.Module):
    """A Llama decoder layer with the same projections as Hugging Face's (q, k, v, o, gate, up, down)."""

    def __init__(self, hidden: int, heads: int, inter: int) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = RMSNorm(hidden), RMSNorm(hidden)
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(hidden, inter, bias=False), nn.Linear(hidden, inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.n1(x)
        q, k, v = (
            m(h).view(b, t, self.heads, c // self.heads).transpose(1, 2) for m in (self.q, self.k, self.v)
        )
        y = F.scaled_dot_product_attention(_rotate(q, cos, sin), _rotate(k, cos, sin), v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, c))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class MiniLlama(nn.Module):
    """Llama-shaped causal LM in plain PyTorch (tied embeddings); ``forward(ids)`` returns the mean loss.

    The rotary tables are plain attributes, not buffers, so ``torch.func`` stacking sees parameters only.
    """

    def __init__(self, shape: dict[str, Any], seq: int, device: torch.device) -> None:
        super().__init__()
        hidden, heads = shape["hidden"], shape["heads"]
        self.embed = nn.Embedding(shape["vocab"], hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, shape["inter"]) for _ in range(shape["layers"]))
        self.norm = RMSNorm(hidden)
        for p in self.parameters():
            if p.ndim >= 2:
                nn.init.normal_(p, std=0.02)
        d = hidden // heads
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        f = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
        emb = torch.cat([f, f], dim=-1)
        self.cos, self.sin = emb.cos().to(device), emb.sin().to(device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        t = ids.shape[-1]
        cos, sin = self.cos[:t], self.sin[:t]
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = F.linear(self.norm(x), self.embed.weight)
        v = logits.shape[-1]
        return F.cross_entropy(logits[..., :-1, :].reshape(-1, v), ids[..., 1:].reshape(-1))


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _adamw(params: list[torch.Tensor], ndim_offset: int = 0, **kw: Any) -> torch.optim.Optimizer:
    decay = [p for p in params if p.ndim - ndim_offset >= 2]
    other = [p for p in params if p.ndim - ndim_offset < 2]
    groups = [{"params": decay, "weight_decay": 0.1}]
    if other:
        groups.append({"params": other, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), **kw)


# --------------------------------------------------------------------------------------------------
# 6. plain loops on a ~125M Llama: tokens/s and model FLOPs utilization
# --------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------
# 7. several small workers on one GPU
# --------------------------------------------------------------------------------------------------

SHAPES = {
    # name: (shape, seq, batch); the engine presets' shapes with a 4096-token vocabulary
    "llama-tiny (1.4M), 8 x 128 tokens": (dict(vocab=4096, hidden=128, layers=4, heads=4, inter=384), 128, 8),
    "llama-10m (11M), 8 x 256 tokens": (dict(vocab=4096, hidden=320, layers=8, heads=5, inter=864), 256, 8),
}
DRY_SHAPES = {"micro, 2 x 16 tokens": (dict(vocab=128, hidden=32, layers=1, heads=2, inter=64), 16, 2)}


class Replica:
    """One worker: its own model, AdamW and batch (reused every step, so no copy is timed)."""

    def __init__(
        self, shape: dict[str, Any], seq: int, batch: int, seed: int, dev: torch.device, hf: bool
    ) -> None:
        torch.manual_seed(seed)
        self.hf = hf
        self.model = (hf_llama(shape, seq) if hf else MiniLlama(shape, seq, dev)).to(dev)
        self.params = list(self.model.parameters())
        self.opt = _adamw(self.params, foreach=True)
        g = torch.Generator(device=dev).manual_seed(seed + 1)
        self.ids = torch.randint(0, shape["vocab"], (batch, seq), device=dev, generator=g)
        self.stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None

    def loss(self) -> torch.Tensor:
        return self.model(input_ids=self.ids, labels=self.ids).loss if self.hf else self.model(self.ids)

    def step(self) -> torch.Tensor:
        loss = self.loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0, foreach=True)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


def _timed(fn: Callable[[], Any], dev: torch.device, repeats: int = 1) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs, the device synchronized around each."""
    times = []
    for _ in range(repeats):
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_sequential(ws: list[Replica], n: int) -> None:
    for _ in range(n):
        for w in ws:
            w.step()


def run_streams(ws: list[Replica], n: int) -> None:
    cur = torch.cuda.current_stream()
    for w in ws:
        assert w.stream is not None
        w.stream.wait_stream(cur)
    for _ in range(n):
        for w in ws:
            with torch.cuda.stream(w.stream):
                w.step()
    for w in ws:
        cur.wait_stream(w.stream)


def run_threads(ws: list[Replica], n: int) -> None:
    barrier = threading.Barrier(len(ws))
    errors: list[BaseException] = []

    def body(w: Replica) -> None:
        try:
            ctx = torch.cuda.stream(w.stream) if w.stream is not None else _null()
            with ctx:
                barrier.wait()
                for _ in range(n):
                    w.step()
            if w.stream is not None:
                w.stream.synchronize()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    if ws[0].stream is not None:
        for w in ws:
            w.stream.wait_stream(torch.cuda.current_stream())
    threads = [threading.Thread(target=body, args=(w,)) for w in ws]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


class Stacked:
    """k replicas as one model: ``torch.func.stack_module_state`` + ``functional_call`` under ``vmap``;
    AdamW on the stacked (k, ...) tensors (element-wise, so the same as k separate AdamWs) and a
    per-replica gradient-norm clip."""

    def __init__(self, ws: list[Replica]) -> None:
        from torch.func import functional_call, stack_module_state, vmap

        self.k = len(ws)
        params, buffers = stack_module_state([w.model for w in ws])
        self.params = params
        self.buffers = buffers
        base = copy.deepcopy(ws[0].model)
        self.ids = torch.stack([w.ids for w in ws])
        self.opt = _adamw(list(params.values()), ndim_offset=1, foreach=True)

        def one(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
            return functional_call(base, (p, b), (ids,))

        self.loss_fn = vmap(one)

    def step(self) -> torch.Tensor:
        # The math attention backend: under vmap on CUDA, the memory-efficient kernel fails with
        # "RuntimeError: LSE is not correctly aligned (strideH)" (seen on an H100, torch 2.11).
        with sdpa_kernel(SDPBackend.MATH):
            losses = self.loss_fn(self.params, self.buffers, self.ids)  # (k,)
            losses.sum().backward()
        grads = [p.grad for p in self.params.values()]
        sq = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0)  # (k,)
        coef = torch.clamp(1.0 / (sq.sqrt() + 1e-6), max=1.0)
        torch._foreach_mul_(grads, [coef.view(-1, *([1] * (g.ndim - 1))) for g in grads])
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return losses.detach()


class Graphed:
    """One worker's whole step (forward, backward, clip, AdamW) captured as a CUDA graph."""

    def __init__(self, w: Replica, warmup: int = 3) -> None:
        self.w = w
        w.opt = _adamw(w.params, foreach=True, capturable=True)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(warmup):
                w.step()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        w.opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            loss = w.loss()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(w.params, 1.0, foreach=True)
            w.opt.step()
        self.loss = loss

    def replay(self) -> None:
        self.graph.replay()


def _check_stacked(shape: dict[str, Any], seq: int, batch: int, dev: torch.device) -> dict[str, Any]:
    """vmap'd replicas against separate ones: the same losses and the same parameters after two steps."""
    ws = [Replica(shape, seq, batch, 100 + i, dev, hf=False) for i in range(2)]
    ref = [Replica(shape, seq, batch, 100 + i, dev, hf=False) for i in range(2)]  # the same seeds
    st = Stacked(ws)
    l_st = [st.step() for _ in range(2)]
    l_ref = [[r.step() for r in ref] for _ in range(2)]
    loss_err = max(
        abs(float(l_st[s][i]) - float(l_ref[s][i])) / abs(float(l_ref[s][i]))
        for s in range(2)
        for i in range(2)
    )
    num = den = 0.0
    for name, p in st.params.items():
        for i, r in enumerate(ref):
            q = dict(r.model.named_parameters())[name]
            num += float((p[i].detach() - q.detach()).pow(2).sum())
            den += float(q.detach().pow(2).sum())
    return {"loss_rel_err": loss_err, "param_rel_err": math.sqrt(num / den)}


def _check_graph(shape: dict[str, Any], seq: int, batch: int, dev: torch.device) -> dict[str, Any]:
    """A captured step replayed against the same steps run eagerly from the same start."""
    w = Replica(shape, seq, batch, 7, dev, hf=False)
    ref = Replica(shape, seq, batch, 7, dev, hf=False)  # the same seed: the same start
    g = Graphed(w, warmup=3)  # 3 eager steps, then capture (captures do not run)
    g.replay()
    for _ in range(4):
        ref.step()
    num = den = 0.0
    for p, q in zip(w.params, ref.params, strict=True):
        num += float((p.detach() - q.detach()).pow(2).sum())
        den += float(q.detach().pow(2).sum())
    return {"param_rel_err": math.sqrt(num / den)}


def _mp_run(
    shape: dict[str, Any], seq: int, batch: int, k: int, n: int, dev: torch.device, timeout: float
) -> dict[str, Any]:
    """k processes, each one worker of its own, started together; aggregate tokens over the common span."""
    tmp = Path(tempfile.mkdtemp(prefix="adloco-mp-"))
    go = tmp / "go"
    procs = []
    for i in range(k):
        spec = dict(
            shape=shape,
            seq=seq,
            batch=batch,
            n=n,
            seed=i,
            ready=str(tmp / f"ready-{i}"),
            go=str(go),
            out=str(tmp / f"out-{i}.json"),
        )
        with (tmp / f"log-{i}").open("w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "mpworker", json.dumps(spec)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        t_end = time.time() + timeout
        while not all((tmp / f"ready-{i}").exists() for i in range(k)):
            if any(p.poll() not in (None, 0) for p in procs) or time.time() > t_end:
                logs = [(tmp / f"log-{i}").read_text(errors="replace") for i in range(k)]
                raise RuntimeError(
                    "a worker process failed before it was ready: "
                    + " | ".join(o.strip()[-400:] for o in logs if o.strip())
                )
            time.sleep(0.01)
        t_go = time.time() + 0.2
        go.write_text(repr(t_go))
        for p in procs:
            p.wait(timeout=max(1.0, t_end - time.time()))
        res = [json.loads((tmp / f"out-{i}.json").read_text()) for i in range(k)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    span = max(r["t_end"] for r in res) - t_go
    return {
        "tokens_per_s": k * n * batch * seq / span,
        "per_process_s": [round(r["t_end"] - r["t_start"], 3) for r in res],
    }


def mpworker(spec: dict[str, Any]) -> None:
    dev = _device()
    torch.set_num_threads(1)
    w = Replica(spec["shape"], spec["seq"], spec["batch"], spec["seed"], dev, hf=False)
    for _ in range(3):
        w.step()
    _sync(dev)
    Path(spec["ready"]).write_text("1")
    go = Path(spec["go"])
    while not go.exists():
        time.sleep(0.0005)
    t_go = float(go.read_text() or "0")
    while time.time() < t_go:
        pass
    t0 = time.time()
    for _ in range(spec["n"]):
        w.step()
    _sync(dev)
    Path(spec["out"]).write_text(json.dumps({"t_start": t0, "t_end": time.time()}))


REPEATS = 3  # timed windows per measurement; the median is reported
# In the order they are measured: when time runs short, the last ones are left out.
APPROACHES = [
    ("a", "sequential, one thread (the engine today)"),
    ("f", "CUDA graph per worker step, replayed in turn"),
    ("f2", "CUDA graph per worker, one stream each"),
    ("e", "k processes (time-sliced, no MPS)"),
    ("d", "vmap over stacked replicas (torch.func; math attention)"),
    ("b", "one CUDA stream per worker, one thread"),
    ("c", "one Python thread + stream per worker"),
    ("hf-a", "Hugging Face Llama (the engine's model): sequential"),
]


def multi(dry: bool, save: Save, deadline: float) -> dict[str, Any]:
    dev = _device()
    cuda = dev.type == "cuda"
    ks = [1, 2] if dry else [1, 2, 4]
    target = 0.05 if dry else 0.2  # seconds for one worker's timed steps (each of 3 repeats)
    shapes = DRY_SHAPES if dry else SHAPES
    try:
        import transformers  # noqa: F401

        have_hf = True
    except Exception:  # noqa: BLE001
        have_hf = False
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "precision": "fp32 (TF32 off), as the engine's default",
        "ks": ks,
        "approaches": dict(APPROACHES),
        "shapes": {},
        "checks": {},
    }
    first = next(iter(shapes.values()))
    for name, fn in (("stacked_vs_separate", _check_stacked), ("graph_vs_eager", _check_graph)):
        if name == "graph_vs_eager" and not cuda:
            out["checks"][name] = {"skipped": "CUDA only"}
            continue
        try:
            out["checks"][name] = fn(first[0], first[1], first[2], dev)
        except Exception as exc:  # noqa: BLE001
            out["checks"][name] = {"error": _err(exc)}
        _free(dev)
    save(out)

    names = list(shapes)
    for i, sname in enumerate(names):
        shape, seq, batch = shapes[sname]
        share = time.time() + (deadline - time.time()) / (len(names) - i)  # this shape's fair share
        rec: dict[str, Any] = {"seq": seq, "batch": batch, "results": {}}
        out["shapes"][sname] = rec
        t1, rec["params"] = _calibrate(shape, seq, batch, dev)
        n = int(min(300, max(5, target / t1)))
        rec["steps_timed"] = n
        _free(dev)
        for key, _desc in APPROACHES:
            row: dict[str, Any] = {}
            rec["results"][key] = row
            for k in ks:
                if time.time() > share:
                    row[str(k)] = {"skipped": "section time limit"}
                    continue
                if key in ("b", "f", "f2") and not cuda:
                    row[str(k)] = {"skipped": "CUDA only"}
                    continue
                if key.startswith("hf") and not have_hf:
                    row[str(k)] = {"skipped": "transformers missing"}
                    continue
                if dry and (key == "e" or (key.startswith("hf") and k > 1)):
                    row[str(k)] = {"skipped": "dry run"}
                    continue
                t0 = time.time()
                try:
                    row[str(k)] = _measure(key, shape, seq, batch, k, n, dev, share)
                    row[str(k)]["tokens_per_s"] = round(row[str(k)]["tokens_per_s"])
                except Exception as exc:  # noqa: BLE001 - one approach failing must not stop the rest
                    row[str(k)] = {"error": _err(exc)}
                row[str(k)]["s"] = round(time.time() - t0, 1)
                _free(dev)
                _ratios(rec)
                save(out)
    return out


def _ratios(rec: dict[str, Any]) -> None:
    """Each result against the same approach at k = 1 and against one sequential worker (a, k = 1)."""
    seq1 = rec["results"].get("a", {}).get("1", {}).get("tokens_per_s")
    for row in rec["results"].values():
        base = row.get("1", {}).get("tokens_per_s")
        for r in row.values():
            if "tokens_per_s" in r and base:
                r["vs_own_k1"] = round(r["tokens_per_s"] / base, 2)
            if "tokens_per_s" in r and seq1:
                r["vs_sequential_k1"] = round(r["tokens_per_s"] / seq1, 2)
    ga = rec["results"].get("f", {}).get("1", {}).get("tokens_per_s")
    if seq1 and ga:
        rec["graph_over_eager_k1"] = round(ga / seq1, 2)


def _calibrate(shape: dict[str, Any], seq: int, batch: int, dev: torch.device) -> tuple[float, int]:
    """(seconds per step, parameters) of one worker stepping sequentially."""
    w = Replica(shape, seq, batch, 0, dev, hf=False)
    for _ in range(3):
        w.step()
    return _timed(lambda: run_sequential([w], 5), dev) / 5, n_params(w.model)


def _measure(
    key: str, shape: dict[str, Any], seq: int, batch: int, k: int, n: int, dev: torch.device, deadline: float
) -> dict[str, Any]:
    tok = seq * batch
    if key == "e":
        return _mp_run(shape, seq, batch, k, n, dev, timeout=max(20.0, deadline - time.time()))
    hf = key.startswith("hf")
    ws = [Replica(shape, seq, batch, i, dev, hf=hf) for i in range(k)]
    if key == "d":
        import warnings

        st = Stacked(ws)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                st.step()
        notes = sorted({str(w.message)[:200] for w in caught})
        dt = _timed(lambda: [st.step() for _ in range(n)], dev, REPEATS)
        res = {"tokens_per_s": k * n * tok / dt, "round_ms": round(dt / n * 1e3, 3)}
        if notes:
            res["warnings"] = notes
        return res
    if key in ("f", "f2"):
        gs = [Graphed(w) for w in ws]
        streams = [torch.cuda.Stream() for _ in gs]

        def replay(m: int) -> None:
            if key == "f":
                for _ in range(m):
                    for g in gs:
                        g.replay()
            else:
                cur = torch.cuda.current_stream()
                for s in streams:
                    s.wait_stream(cur)
                for _ in range(m):
                    for g, s in zip(gs, streams, strict=True):
                        with torch.cuda.stream(s):
                            g.replay()
                for s in streams:
                    cur.wait_stream(s)

        replay(2)
        dt = _timed(lambda: replay(n), dev, REPEATS)
        return {"tokens_per_s": k * n * tok / dt, "round_ms": round(dt / n * 1e3, 3)}
    fn = {
        "a": run_sequential,
        "b": run_streams,
        "c": run_threads,
        "hf-a": run_sequential,
        "hf-b": run_streams,
        "hf-c": run_threads,
    }[key]
    fn(ws, 3)
    dt = _timed(lambda: fn(ws, n), dev, REPEATS)
    return {"tokens_per_s": k * n * tok / dt, "round_ms": round(dt / n * 1e3, 3)}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "mpworker":
        mpworker(json.loads(sys.argv[2]))
    else:
        print("usage: gpu_micro.py mpworker JSON  (the rest is driven by benchmarks/gpu.py)", file=sys.stderr)
        sys.exit(2)
