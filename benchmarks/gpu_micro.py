"""Standalone PyTorch measurements for ``benchmarks/gpu.py``: the matmul ceiling, plain training loops on a
~125M Llama, and ways of running several small workers on one GPU. Imports torch (and transformers where a
Hugging Face model is asked for), never adloco, so it measures the hardware and PyTorch, not the engine.

Each entry point takes a ``save(result)`` callback and calls it after every measurement, so a section
stopped at its time limit still leaves what it measured. ``python benchmarks/gpu_micro.py mpworker JSON``
is one process of the multi-process measurement.

This module holds the environment part (``env``: versions, the matmul ceiling) and the command line; the
plain loops (``overhead``, ``compile_plain``) live in ``gpu_micro_plain.py``, the multi-worker measurements
(``multi``, ``mpworker``) in ``gpu_micro_multi.py``, both re-exported here, and what they share (device
helpers, the models) in ``gpu_micro_models.py``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
from gpu_micro_models import Save, _device, _err, _free
from gpu_micro_multi import mpworker, multi
from gpu_micro_plain import compile_plain, overhead

# what benchmarks/gpu.py's children call (env is here, the rest in gpu_micro_plain and gpu_micro_multi)
__all__ = ["compile_plain", "env", "mpworker", "multi", "overhead"]


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


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "mpworker":
        mpworker(json.loads(sys.argv[2]))
    else:
        print("usage: gpu_micro.py mpworker JSON  (the rest is driven by benchmarks/gpu.py)", file=sys.stderr)
        sys.exit(2)
