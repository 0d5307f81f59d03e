"""Heterogeneous workers, emulated: 4 processes whose steps take 1, 1, 2 and 4 times as long
(`runtime.emulate_speed: [1, 1, 0.5, 0.25]`), AdLoCo and DiLoCo, work shared by measured speed against
shared equally, at the same budget of training examples.

Each row is an ordinary `adloco train --nproc 4` run on `configs/bench-cpu.yaml`'s model and data with
the budget below; the table gives wall time, the mean idle share (1 − mean/max of each trainer's
workers' compute times, per round), final validation perplexity and the simulated time. Emulated speed
is real sleeping, so wall time is what a user waits. About 20 minutes on 2 CPU cores.

``--profile PATH`` (a step-time profile of one worker's device, ``adloco profile``) adds a
``speed+profile`` row per method: speeds measured net of a step's fixed cost and rows shared so that
steps take the same time (ALGORITHM.md §9.3); its simulated time is priced by the profile, the others'
by measured compute. ``--profile auto``: the run fits its profile from its own rounds
(``runtime.profile: auto``), which under contention includes what the contention costs.
Usage:  python benchmarks/heterogeneous.py [--budget 3072] [--methods adloco,diloco] [--profile PATH|auto]
                                          [--out benchmarks/out/heterogeneous]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from adloco.bench.runner import Train

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/out/heterogeneous")
    ap.add_argument("--budget", type=int, default=3072)
    ap.add_argument("--methods", default="adloco,diloco")
    ap.add_argument(
        "--profile",
        help="a step-time profile, or auto (fitted by each run): adds a speed+profile row per method",
    )
    args = ap.parse_args()
    rows = []
    balances = ["speed", "equal"] + (["speed+profile"] if args.profile else [])
    for method in args.methods.split(","):
        for balance in balances:
            name = f"{method}-{balance.replace('+', '-')}"
            where = args.profile if args.profile == "auto" else Path(args.profile or ".").resolve()
            profile = [f"runtime.profile={where}"] if balance == "speed+profile" else []
            sets = [
                f"algorithm.method={method}",
                # as RESULTS.md measured it: the default became auto (Muon on a CPU); LocalSGD keeps its SGD
                *([] if method == "localsgd" else ["inner.optimizer=adamw"]),
                f"runtime.balance={balance.split('+')[0]}",
                *profile,
                "runtime.emulate_speed=[1,1,0.5,0.25]",
                "runtime.threads=1",
                f"algorithm.budget={args.budget}",
                "algorithm.rounds=64",
                "logging.progress=off",
                "logging.plots=false",
            ]
            run = Train(sets, Path(args.out), name, config=ROOT / "configs/bench-cpu.yaml", nproc=4).run()
            s = run.summary
            shares = [e for e in run.events("worker") if e["round"] == s["rounds"]]
            per_step = {e["worker"]: e["effective"] for e in shares}
            line = (
                f"| {method} | {balance} | {s['wall_s']:.0f} s | {100 * s['idle_share']:.0f}% | "
                f"{s['final_val_ppl']:.1f} | {s['examples_total']:,} | {s['sim_s']:.0f} s | "
                f"{' / '.join(str(per_step[w]) for w in sorted(per_step))} |"
            )
            rows.append(line)
            print(line, flush=True)
    print()
    print(
        "| method | balance | wall | idle share | final val ppl | examples | simulated time | rows per step, workers 0-3 (last round) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
