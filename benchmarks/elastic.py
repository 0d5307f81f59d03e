"""Runs that survive failures, measured: the restart time after a killed process, and what checkpointing
every round costs a round of the default run.

1. Restart: `adloco train --nproc 4 --max-restarts 1` on a tiny model; rank 1 is SIGKILLed at the start of
   round 3 (test-only fault injection from tests/faultinject); the `membership` event's restart_s is the
   time from the last logged progress to training again.
2. Checkpoint cost: the embedded default run, 4 rounds, in one process, with a checkpoint after every
   round (as elastic runs do), written between rounds and behind training (``checkpoint.async_save``), and
   with none: the training time per round of each, and the time training waited per checkpoint (all of
   the write between rounds; the copy into host memory behind training).

Usage:  python benchmarks/elastic.py [--out benchmarks/out/elastic] [--rounds 4]   (about 10 minutes)
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from adloco.bench.runner import Train

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model.name=llama-micro",
    "data.tokenizer=bpe:300",
    "data.seq_len=16",
    "data.val_fraction=0.2",
    "algorithm.inner_steps=2",
    "batch.initial=2",
    "switch.b_max=2",
    "eval.max_examples=8",
    "logging.progress=off",
    "logging.plots=false",
    "runtime.balance=equal",
    "inner.optimizer=adamw",  # as RESULTS.md measured it: the default became auto (Muon on a CPU)
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/out/elastic")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    out = Path(args.out).resolve()
    corpus = ROOT / "src" / "adloco"

    env = {**os.environ, "OMP_NUM_THREADS": "1", "ADLOCO_TEST_FAULT": "kill@1:3"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "faultinject"), env.get("PYTHONPATH", "")])
    sets = [
        *TINY,
        "algorithm.rounds=5",
        "algorithm.workers=4",
        "algorithm.trainers=2",
        f"data.source={corpus}",
    ]
    restart = Train(sets, out / "restart", "restart", nproc=4, max_restarts=1, env=env).run()
    member = next(iter(restart.events("membership")))
    print(
        f"restart: rank 1 killed at round 3 of `adloco train --nproc 4 --max-restarts 1`; training again "
        f"{member['restart_s']:.1f} s after the last progress, from round {member['round']}",
        flush=True,
    )

    rows = {}
    for name, every, behind in (("none", 0, False), ("every round", 1, False), ("behind", 1, True)):
        sets = [
            f"algorithm.rounds={args.rounds}",
            f"checkpoint.every={every}",
            f"checkpoint.async_save={str(behind).lower()}",
            "inner.optimizer=adamw",  # as RESULTS.md measured it (the checkpoint holds its state)
            "logging.progress=off",
            "logging.plots=false",
            "logging.save_model=false",
        ]
        slug = name.replace(" ", "-")  # a run name is a plain name
        evs = Train(sets, out / f"checkpoint-{slug}", f"checkpoint-{slug}").run().events()
        train = [e["train_s"] for e in evs if e["event"] == "round"]
        ck = [e for e in evs if e["event"] == "checkpoint"]
        rows[name] = (statistics.median(train), [c["stall_s"] for c in ck], [c["seconds"] for c in ck], ck)
        print(f"checkpoints {name}: median round {rows[name][0]:.2f} s", flush=True)
    base = rows["none"][0]
    print()
    print("| checkpoints | median training time per round | waited per checkpoint | written in | size |")
    print("|---|---|---|---|---|")
    print(f"| none | {base:.2f} s | | | |")
    for name, label in (("every round", "every round"), ("behind", "every round, checkpoint.async_save")):
        with_ck, stalls, writes, ck = rows[name]
        size = ck[0]["bytes"] if ck else 0
        print(
            f"| {label} | {with_ck:.2f} s ({100 * (with_ck / base - 1):+.1f}%) | "
            f"{statistics.median(stalls) * 1e3:.0f} ms ({100 * statistics.median(stalls) / base:.2f}% of a "
            f"round) | {statistics.median(writes):.2f} s | {size / 1e6:.1f} MB |"
        )


if __name__ == "__main__":
    main()
