"""Compressed pseudo-gradients on the embedded default run: the bytes of Δ and the final perplexity of
each wire dtype, with and without error feedback, against float32.

Each row is an ordinary `adloco train` run (the default config plus `--set comm.dtype=...`), printed with
its command. Targets (issue: compressed pseudo-gradients): int8 sends under 0.3x float32's Δ bytes with a
final validation perplexity within 3%; int4 under 0.17x, perplexity reported. About 15 minutes on 2 CPU
cores. Usage:  python benchmarks/compression.py [--out benchmarks/out/compression]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from adloco.bench.runner import Train

VARIANTS: list[tuple[str, list[str]]] = [
    ("float32", []),
    ("bfloat16", ["comm.dtype=bfloat16"]),
    ("int8", ["comm.dtype=int8"]),
    ("int8 + error feedback", ["comm.dtype=int8", "comm.error_feedback=true"]),
    ("int4", ["comm.dtype=int4"]),
    ("int4 + error feedback", ["comm.dtype=int4", "comm.error_feedback=true"]),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/out/compression")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more --set for every run")
    args = ap.parse_args()
    rows, base = [], None
    # AdamW, as RESULTS.md measured it: the default became auto (Muon on a CPU)
    every = ["inner.optimizer=adamw", *args.extra]
    for label, sets in VARIANTS:
        name = label.replace(" + ", "-").replace(" ", "-")
        run = ["logging.progress=off", "logging.save_model=false", *every, *sets]
        s = Train(run, Path(args.out), name).run().summary
        delta = s["bytes_by_kind"].get("delta", 0)
        base = base or s
        ratio = delta / base["bytes_by_kind"]["delta"]
        ppl = s["final_val_ppl"]
        change = 100 * (ppl / base["final_val_ppl"] - 1)
        cmd = "adloco train" + "".join(f" --set {x}" for x in [*every, *sets])
        rows.append(
            f"| {label} | {delta / 1e6:.1f} MB | {ratio:.3f}x | {s['bytes_total'] / 1e6:.1f} MB | {ppl:.1f} | "
            f"{change:+.1f}% | {max(s['requests_final'].values())} | {s['examples_total']:,} | `{cmd}` |"
        )
        print(rows[-1], flush=True)
    print(
        "\n| wire dtype | Δ bytes | vs float32 | all bytes | final val ppl | vs float32 | largest request | examples | command |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
