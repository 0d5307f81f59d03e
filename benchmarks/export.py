"""Host memory of writing the final model (`<run>/model`) from a sharded worker: how far each rank's resident
set rises above where it stood once training and the final checkpoint were done.

One DiLoCo worker sharded over k processes (`runtime.shards: k`, FSDP2, gloo), one round of one step at
batch 1: an ordinary `adloco train --nproc k` run, its ranks polled from /proc. When rank 0 has logged
the run's only checkpoint (the end-of-run one; the model is written after it), the script resets each
rank's peak (`echo 5 > /proc/PID/clear_refs`: `VmHWM` becomes the resident set then); the `VmHWM` kept
from then to the rank's exit, minus its value right after the reset, is what writing the model cost the rank (a run with
`logging.save_model: false` is the control: what the end of a run costs without it). `--src DIR` runs
another checkout's `src` (on PYTHONPATH, ahead of the installed package), for a before/after:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/export.py --model microllama-300m --file-mb 256
    git worktree add /tmp/before <commit> && OMP_NUM_THREADS=1 .venv/bin/python benchmarks/export.py \\
        --model microllama-300m --src /tmp/before/src --file-mb 0        # 0: leave logging.model_file_mb out

Usage:  python benchmarks/export.py [--model llama-30m] [--k 2] [--file-mb 16] [--src DIR]
                                    [--out benchmarks/out/export] [--poll 0.05]
Linux only (reads /proc; resetting a peak needs the processes' owner). About 3 minutes for
microllama-300m on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from shards import MIB, children, hwm, rank_of  # benchmarks/shards.py

from adloco.bench.runner import Train

ROOT = Path(__file__).resolve().parents[1]


def checkpointed(train: Train) -> bool:
    run = train.run_dir()
    with contextlib.suppress(OSError):
        return run is not None and '"event":"checkpoint"' in (run / "metrics.jsonl").read_text()
    return False


def watch(train: Train, log: Path, poll: float) -> tuple[int, dict[int, int], dict[int, int], float]:
    """Run ``train``; once its checkpoint is logged, each rank's resident set then and its peak from then to
    its exit (the peak reset through clear_refs). Returns the exit code, {rank: VmHWM right after the reset},
    {rank: VmHWM after it} and the wall time."""
    at_reset: dict[int, int] = {}
    after: dict[int, int] = {}
    ranks: dict[int, int] = {}
    t0 = time.perf_counter()
    with log.open("w") as f:
        p = train.start(stdout=f, stderr=subprocess.STDOUT)
        while True:
            done = p.poll() is not None
            for pid in children(p.pid):
                if pid not in ranks:
                    r = rank_of(pid)
                    if r is None:
                        continue
                    ranks[pid] = r
            if not at_reset and checkpointed(train):
                for pid, r in ranks.items():
                    with contextlib.suppress(OSError):
                        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak := the resident set now
                        now = hwm(pid)
                        if now is not None:
                            at_reset[r] = now
            if at_reset:
                for pid, r in ranks.items():
                    v = hwm(pid)
                    if v is not None and r in at_reset:
                        after[r] = max(after.get(r, 0), v)
            if done:
                break
            time.sleep(poll)
    return p.returncode, at_reset, after, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-30m")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--file-mb", type=int, default=16, help="logging.model_file_mb (0: not set)")
    ap.add_argument("--src", type=Path, help="another checkout's src folder to run (default: this one's)")
    ap.add_argument("--out", default="benchmarks/out/export")
    ap.add_argument("--poll", type=float, default=0.05)
    args = ap.parse_args()
    if args.k < 2 or args.file_mb < 0:
        raise SystemExit("export.py: --k must be >= 2 (a sharded worker) and --file-mb >= 0")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args.src is not None:
        if not (args.src / "adloco" / "__init__.py").is_file():
            raise SystemExit(f"export.py: --src {args.src}: no adloco package there")
        env["PYTHONPATH"] = os.pathsep.join([str(args.src.resolve()), *filter(None, [env.get("PYTHONPATH")])])
    command = [sys.executable, "-m", "adloco", "train"]
    base = [
        f"model.name={args.model}",
        "algorithm.method=diloco",
        "inner.optimizer=adamw",  # as RESULTS.md measured it: the default became auto (Muon on a CPU)
        "algorithm.workers=1",
        "algorithm.trainers=1",
        "algorithm.rounds=1",
        "algorithm.inner_steps=1",
        "batch.initial=1",
        "switch.b_max=1",
        "data.seq_len=64",
        "eval.max_examples=4",
        f"runtime.shards={args.k}",
        "runtime.threads=1",
        "logging.plots=false",
        "logging.progress=off",
    ]
    rows = {}
    for save in (False, True):
        name = f"{args.model}-k{args.k}-save-{str(save).lower()}"
        sets = [*base, f"logging.save_model={str(save).lower()}"]
        if save and args.file_mb:
            sets.append(f"logging.model_file_mb={args.file_mb}")
        train = Train(sets, out, name, nproc=args.k, env=env, cwd=ROOT, command=command)
        code, at_reset, after, wall = watch(train, out / f"{name}.log", args.poll)
        if code != 0:
            raise SystemExit(f"{name}: failed (exit {code})\n{(out / f'{name}.log').read_text()[-3000:]}")
        if sorted(at_reset) != list(range(args.k)):
            raise SystemExit(f"{name}: the ranks' memory was not read at the checkpoint: {at_reset}")
        run = train.result(code)
        files = sorted(p.name for p in (run.folder / "model").glob("*.safetensors")) if save else []
        rows[save] = (at_reset, after, files)
        P = next(e for e in run.events() if e["event"] == "start")["parameters"]
        print(f"{name}: {wall:.0f} s, {len(files)} model files", flush=True)
    print(
        f"\n{args.model} ({P:,} parameters, {4 * P / MIB:,.0f} MiB in float32), one worker sharded over "
        f"k = {args.k}; src: {args.src or 'this checkout'}; logging.model_file_mb: {args.file_mb or 'not set'}\n"
    )
    print(
        "| rank | resident set after the final checkpoint (model saved) | peak after it, no model saved | rise | "
        "peak after it, model saved | rise |"
    )
    print("|---|---|---|---|---|---|")
    for r in range(args.k):
        cells = []
        for save in (False, True):
            at, peak = rows[save][0][r], rows[save][1].get(r, rows[save][0][r])
            cells.append(f"{peak / MIB:,.0f} MiB | {(peak - at) / MIB:+,.0f} MiB")
        print(f"| {r} | {rows[True][0][r] / MIB:,.0f} MiB | {' | '.join(cells)} |")
    print(f"\nmodel files: {', '.join(rows[True][2])}")


if __name__ == "__main__":
    main()
