"""Memory per rank of one DiLoCo worker sharded over k processes (`runtime.shards: k`, FSDP2 on a
(worker, shard) mesh, gloo on CPU), k = 1, 2, 4: llama-10m, one worker, one trainer, a few rounds.

Each row is an ordinary `adloco train --nproc k` run on `configs/bench-cpu-10m.yaml`'s model and data
with one worker (`algorithm.workers=1`, so the k processes are the worker's shards); k = 1 is the
baseline, `--nproc 1` without `runtime.shards` (an unsharded worker in one process). While a run goes,
this script polls the launcher's child processes (the ranks) every ``--poll`` seconds and keeps the
last ``VmHWM`` (peak resident set) read from ``/proc/<pid>/status`` before each exits, and also the
VmHWM as of the poll at which rank 0 has logged the last round: the peak through training and
evaluation, before the end-of-run checkpoint (written by every run, sharded ones too: each rank writes
its own P/k values through torch.distributed.checkpoint). The table gives, per rank: the parameters it holds
(P/k), the parameter + gradient + AdamW (exp_avg, exp_avg_sq) bytes that come to, computed as
ceil(P/k) x 4 bytes x 4 (llama-10m's dim-0 sizes, 320, 864 and 4096, are multiples of 4, so FSDP2
pads nothing at k = 2, 4), its measured peak RSS both ways, and the median round and training time
(rounds 2 on; round 1 includes start-up). A bare process that only imports torch and adloco is
measured the same way first: the library's base RSS, common to every rank. With one worker there is
no Δ traffic between workers: the Δ bytes per round are 0, and the shards' own all-gathers and
reduce-scatters inside a worker are not counted by adloco's telemetry.

About 5 minutes on 2 CPU cores (the k = 4 ranks share them). Linux only (reads /proc).
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/shards.py
Usage:  python benchmarks/shards.py [--ks 1,2,4] [--rounds 3] [--inner-steps 4] [--batch 4]
                                    [--poll 0.2] [--out benchmarks/out/shards]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from adloco.bench.runner import Train

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
BARE = "import torch, adloco.engine.train; import time; time.sleep(1)"  # the library's base RSS


def children(pid: int) -> list[int]:
    """The pids of a process's children (every thread's list)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return out


def hwm(pid: int) -> int | None:
    """VmHWM (peak resident set) of a live process, in bytes; None once it has gone (or is a zombie)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for kv in env:
        if kv.startswith(b"RANK="):
            return int(kv[5:])
    return None


def rounds_logged(train: Train) -> int:
    """Round events rank 0 has written so far to the run's directory (metrics.jsonl is flushed line by
    line)."""
    run = train.run_dir()
    if run is None:
        return 0
    try:
        text = run.joinpath("metrics.jsonl").read_text()
    except OSError:
        return 0
    return text.count('"event":"round"')


def watch(
    start: Callable[..., subprocess.Popen[str]],
    log: Path,
    poll: float,
    ranks: bool,
    trained: Callable[[], bool] = lambda: False,
) -> tuple[int, dict[str, int], dict[str, int], float]:
    """Run ``start(stdout=..., stderr=...)``, polling its processes' VmHWM; returns its exit code, the
    last VmHWM seen per process ("launcher", "rank R", or "child PID" without a RANK) over the whole run
    and as of the first poll at which ``trained()`` held (before the final checkpoint), and the wall
    time."""
    peaks: dict[str, int] = {}
    before: dict[str, int] = {}
    names: dict[int, str] = {}
    t0 = time.perf_counter()
    with log.open("w") as f:
        p = start(stdout=f, stderr=subprocess.STDOUT)
        names[p.pid] = "launcher" if ranks else "process"
        while True:
            done = p.poll() is not None
            for pid in [p.pid, *children(p.pid)]:
                if pid not in names:
                    r = rank_of(pid)
                    names[pid] = f"rank {r}" if r is not None else f"child {pid}"
                v = hwm(pid)
                if v is not None:
                    peaks[names[pid]] = max(peaks.get(names[pid], 0), v)
            if not before and trained():
                before = dict(peaks)
            if done:
                break
            time.sleep(poll)
    return p.returncode, peaks, before, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/out/shards")
    ap.add_argument("--ks", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inner-steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--poll", type=float, default=0.2)
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t_all = time.perf_counter()

    bare = functools.partial(subprocess.Popen, [sys.executable, "-c", BARE], cwd=ROOT, text=True)
    code, peaks, _, _ = watch(bare, out / "bare.log", args.poll, ranks=False)
    if code != 0:
        raise SystemExit(f"bare import: failed\n{(out / 'bare.log').read_text()[-2000:]}")
    base = peaks["process"]
    print(f"bare process (import torch, adloco.engine.train): peak RSS {base / MIB:.0f} MiB", flush=True)

    rows = []
    for k in [int(x) for x in args.ks.split(",")]:
        name = f"shards-k{k}"
        sets = [
            "algorithm.method=diloco",
            "inner.optimizer=adamw",  # as RESULTS.md measured it: the default became auto (Muon on a CPU)
            "algorithm.workers=1",
            "algorithm.trainers=1",
            f"algorithm.rounds={args.rounds}",
            f"algorithm.inner_steps={args.inner_steps}",
            f"batch.initial={args.batch}",
            f"switch.b_max={args.batch}",
            *([f"runtime.shards={k}"] if k > 1 else []),
            "runtime.threads=1",
            "logging.save_model=false",
            "logging.plots=false",
            "logging.progress=off",
        ]
        train = Train(sets, out, name, config=ROOT / "configs/bench-cpu-10m.yaml", nproc=k, cwd=ROOT)

        def trained(train: Train = train) -> bool:
            return rounds_logged(train) >= args.rounds

        code, peaks, before, wall = watch(train.start, out / f"{name}.log", args.poll, True, trained)
        if code != 0:
            raise SystemExit(f"{name}: failed (exit {code})\n{(out / f'{name}.log').read_text()[-3000:]}")
        run = train.result(code)
        s = run.summary
        evs = run.events()
        start = next(e for e in evs if e["event"] == "start")
        rounds = [e for e in evs if e["event"] == "round"]
        later = [e for e in rounds if e["round"] > 1] or rounds
        P = start["parameters"]
        per = math.ceil(P / k)
        rss = {}
        for when, seen in (("train", before), ("all", peaks)):
            got = [seen.get(f"rank {r}") for r in range(k)]
            if any(v is None for v in got):
                raise SystemExit(f"{name}: no VmHWM read for some rank ({when}): {seen}")
            rss[when] = (max(got), " / ".join(f"{v / MIB:.0f}" for v in got))  # type: ignore[type-var,operator]
        bytes_round = statistics.median(e["bytes"] for e in rounds)
        line = (
            f"| {k} | {start['processes']} | {per / 1e6:.2f}M | {16 * per / MIB:.0f} MiB | "
            f"{rss['train'][0] / MIB:.0f} MiB ({rss['train'][1]}) | {(rss['train'][0] - base) / MIB:.0f} MiB | "
            f"{rss['all'][0] / MIB:.0f} MiB ({rss['all'][1]}) | "
            f"{statistics.median(e['round_s'] for e in later):.2f} s | "
            f"{statistics.median(e['train_s'] for e in later):.2f} s | {bytes_round:.0f} | "
            f"{peaks['launcher'] / MIB:.0f} MiB | {s['peak_memory_bytes'] / MIB:.0f} MiB | {wall:.0f} s |"
        )
        rows.append(line)
        print(line, flush=True)

    print()
    print(
        f"llama-10m, {P:,} parameters (P), DiLoCo, 1 worker, 1 trainer, {args.rounds} rounds of H = "
        f"{args.inner_steps} steps of batch {args.batch}; bare torch + adloco process: {base / MIB:.0f} MiB"
    )
    print()
    print(
        "| k | processes | parameters per rank | param+grad+AdamW per rank (computed) | peak RSS per rank "
        "through the last round: max (rank 0 / 1 / ...) | that max − bare | peak RSS per rank, whole run "
        "(with the final checkpoint): max (rank 0 / 1 / ...) | median round time | median train time | "
        "Δ bytes per round (one worker: none) | launcher RSS | summary peak_memory_bytes (rank 0) | wall |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\nbenchmark took {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
