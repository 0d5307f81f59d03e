"""Distributed backend on one machine: examples/s, share of round time in communication, bytes per round.

The same 4 workers run in one process (the in-process backend) and over torch.distributed as 1 process
x 4 workers, 2 x 2 and 4 x 1, every process with one thread. The job is DiLoCo-shaped so that every
round moves the same data: one trainer over the 4 workers, constant batch, one all-reduce of Δ a round.
Rounds are timed without evaluation, skipping the first (warm-up). Each layout runs ``--repeats`` times;
medians are reported. Usage:  python benchmarks/distributed.py [--rounds 6] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from adloco.bench.runner import Train

LAYOUTS = [
    ("in-process, 4 workers", None, 4),
    ("1 process x 4 workers", 1, 4),
    ("2 processes x 2 workers", 2, 2),
    ("4 processes x 1 worker", 4, 1),
]


def run(nproc: int | None, wpp: int, rounds: int, H: int, b: int, out: Path) -> dict[str, float]:
    sets = [
        "algorithm.method=diloco",
        "inner.optimizer=adamw",  # as RESULTS.md measured it: the default became auto (Muon on a CPU)
        "algorithm.workers=4",
        f"algorithm.rounds={rounds}",
        f"algorithm.inner_steps={H}",
        f"batch.initial={b}",
        f"switch.b_max={b}",
        "runtime.threads=1",
        "logging.progress=off",
        "logging.plots=false",
        "logging.save_model=false",
        f"eval.every={rounds + 1}",
        *([f"runtime.workers_per_process={wpp}"] if nproc is not None else []),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rounds_ev = Train(sets, out, "layout", nproc=nproc, env=env).run().events("round")
    rounds_ev = rounds_ev[1:-1]  # no warm-up, no final evaluation
    train_s = sum(e["train_s"] for e in rounds_ev)
    return {
        "examples_per_s": sum(e["examples"] for e in rounds_ev) / train_s,
        "comm_share": sum(e["comm_s"] for e in rounds_ev) / train_s,
        "bytes_per_round": statistics.mean(e["bytes"] for e in rounds_ev),
        "round_s": train_s / len(rounds_ev),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--inner-steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in LAYOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, nproc, wpp in LAYOUTS:
                out = Path(tmp) / f"{rep}-{name.replace(' ', '_')}"
                r = run(nproc, wpp, args.rounds, args.inner_steps, args.batch, out)
                results[name].append(r)
                print(
                    f"repeat {rep + 1} {name:26s} {r['examples_per_s']:7.1f} examples/s  "
                    f"comm {100 * r['comm_share']:5.1f}%  {r['bytes_per_round'] / 1e6:6.1f} MB/round",
                    flush=True,
                )
    print(
        f"\nllama-tiny, 4 workers, 1 trainer (DiLoCo), H={args.inner_steps}, batch {args.batch}, "
        f"{args.rounds - 2} timed rounds, 1 thread per process, median of {args.repeats}\n"
    )
    print("| layout | examples/s | round (s) | communication share | bytes per round |")
    print("|---|---|---|---|---|")
    for name, _, _ in LAYOUTS:
        rs = results[name]
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(
            f"| {name} | {med['examples_per_s']:.1f} | {med['round_s']:.2f} | {100 * med['comm_share']:.1f}% | "
            f"{med['bytes_per_round'] / 1e6:.1f} MB |"
        )


if __name__ == "__main__":
    main()
