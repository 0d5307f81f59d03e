"""Start-up of a sharded worker's replica (`runtime.shards: k`, ALGORITHM.md §12): built on the meta device
with each rank materializing its own rows (`ModelFactory.build_sharded`), against building the whole model
on every rank and sharding it (what every sharded run did before, and still does for a checkpoint).

Each row is one rank of a worker of k, in a fresh process: torch's fake process group stands in for the
other k - 1 ranks (building a replica needs no collective), and `adloco.engine.build.build_replicas`
builds that rank's replica exactly as `adloco train` does. Measured per process: the CPU seconds of
`build_replicas` (user + system, robust when other jobs share the cores; wall time is not), the resident
set before it (imports, the tokenizer-free factory), and the peak resident set of the whole process
(`ru_maxrss`); the growth, peak minus before, is what building the replica cost in host memory.
The whole-model path is forced by making `build_sharded` refuse, as it refuses a checkpoint.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/meta_init.py                 # about 1 minute on 2 cores
Usage:  python benchmarks/meta_init.py [--models llama-30m:4096,microllama-300m:32000] [--ks 2,4]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def one(mode: str, model: str, vocab: int, k: int, rank: int) -> dict[str, float]:
    """Build rank ``rank``'s replica of one worker of k (in this process) and measure it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from adloco.config import resolve
    from adloco.engine.driver import build_replicas
    from adloco.models import ModelFactory
    from adloco.models.meta import NotReplayable

    torch.set_num_threads(1)
    cfg = resolve(base={"model": {"name": model}, "algorithm": {"workers": 1, "trainers": 1}})
    factory = ModelFactory(cfg.model, vocab, cfg.data.seq_len, 0, 0)
    if mode == "whole":

        def refuse(*args: object, **kwargs: object) -> None:
            raise NotReplayable("forced")

        factory.build_sharded = refuse  # type: ignore[method-assign]
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=k)
    mesh = init_device_mesh("cpu", (k,))
    comm = type(
        "Comm", (), {"local_workers": [0], "shards": type("S", (), {"size": k}), "mesh": {"shard": mesh}}
    )
    before = rss()
    t = time.process_time()
    (replica,) = build_replicas(cfg, comm, factory, torch.device("cpu"))
    cpu = time.process_time() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    held = sum(p.to_local().numel() for p in replica.parameters()) * 4
    dist.destroy_process_group()
    return {"cpu_s": cpu, "before_mib": before / MIB, "peak_mib": peak / MIB, "shard_mib": held / MIB}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama-30m:4096,microllama-300m:32000", help="PRESET:VOCAB,...")
    ap.add_argument("--ks", default="2,4")
    ap.add_argument("--one", nargs=5, metavar=("MODE", "MODEL", "VOCAB", "K", "RANK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        mode, model, vocab, k, rank = args.one
        print(json.dumps(one(mode, model, int(vocab), int(k), int(rank))))
        return
    print(
        "| model (vocabulary) | k | rank | build | CPU s | RSS before MiB | peak RSS MiB | growth MiB | its shard MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in args.models.split(","):
        model, vocab = spec.split(":")
        for k in (int(x) for x in args.ks.split(",")):
            for rank in (0, k - 1):
                for mode in ("whole", "meta"):
                    cmd = [sys.executable, __file__, "--one", mode, model, vocab, str(k), str(rank)]
                    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    print(
                        f"| {model} ({int(vocab):,}) | {k} | {rank} | {mode} | {r['cpu_s']:.2f} | "
                        f"{r['before_mib']:,.0f} | {r['peak_mib']:,.0f} | {r['peak_mib'] - r['before_mib']:,.0f} | "
                        f"{r['shard_mib']:,.0f} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
