"""``adloco`` with a GPU memory cap or with gloo forced on CUDA: what ``benchmarks/gpu.py`` needs and the CLI
has no switch for. Usage:

    python benchmarks/gpu_launch.py [--mem-gib G] [--force-gloo] -- train --set ...

``--mem-gib G`` caps this process's CUDA caching allocator at G GiB
(``torch.cuda.set_per_process_memory_fraction``), so a too-large micro-batch runs out of memory as it would
on a smaller or shared GPU. ``--force-gloo`` makes ``torch.distributed.init_process_group`` use gloo where
the engine asks for NCCL (it picks NCCL whenever it runs on CUDA), to see whether gloo carries its CUDA
tensors; run it under torchrun like ``-m adloco``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mem-gib", type=float, help="cap the CUDA caching allocator at this many GiB")
    ap.add_argument("--force-gloo", action="store_true", help="gloo where the engine asks for NCCL")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the adloco arguments")
    args = ap.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    src = Path(__file__).resolve().parents[1] / "src"
    if src.is_dir() and str(src) not in sys.path:
        sys.path.insert(0, str(src))

    import torch

    if args.mem_gib is not None and torch.cuda.is_available():
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        total = torch.cuda.get_device_properties(dev).total_memory
        fraction = min(1.0, args.mem_gib * 2**30 / total)
        torch.cuda.set_per_process_memory_fraction(fraction, dev)
        print(
            f"gpu_launch: CUDA allocator capped at {args.mem_gib:g} GiB ({fraction:.4f} of the device)",
            flush=True,
        )
    if args.force_gloo:
        import torch.distributed as dist

        original = dist.init_process_group

        def init_process_group(backend: Any = None, *a: Any, **kw: Any) -> Any:
            if backend == "nccl":
                print("gpu_launch: nccl -> gloo", flush=True)
                backend = "gloo"
            return original(backend, *a, **kw)

        dist.init_process_group = init_process_group  # type: ignore[assignment]

    from adloco.cli import main as adloco_main

    return adloco_main(rest)


if __name__ == "__main__":
    sys.exit(main())
