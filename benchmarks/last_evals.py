"""Each run's last validation perplexities: its final, its lowest (and at which round), and the mean of
its last five evaluations, which tempers the round-to-round noise of a small validation set
(``eval.max_examples``). With ``--same-as RUN`` and ``--rounds A-B``: whether two runs logged the same
perplexity, loss and bytes in every round from A to B (a continued run against the run it must equal).

Usage:  python benchmarks/last_evals.py RUN_DIR [RUN_DIR ...]
        python benchmarks/last_evals.py RUN_DIR --same-as OTHER_RUN_DIR --rounds 89-98
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def die(message: str) -> None:
    print(f"last_evals.py: {message}", file=sys.stderr)
    sys.exit(2)


def rounds(run: Path) -> dict[int, dict]:
    """The run's round events that carry a validation perplexity, by round."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        die(f"{str(run)!r}: not a run directory (no metrics.jsonl)")
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if e.get("event") == "round" and e.get("val_ppl") is not None:
            out[int(e["round"])] = e
    if not out:
        die(f"{str(run)!r}: no evaluated round in its metrics.jsonl")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--same-as", metavar="RUN_DIR", help="compare the one RUN_DIR with this run, round by round"
    )
    p.add_argument("--rounds", metavar="A-B", help="with --same-as: the rounds to compare")
    args = p.parse_args()
    if args.same_as is not None:
        if len(args.runs) != 1 or args.rounds is None:
            p.error("--same-as: one RUN_DIR and --rounds A-B")
        try:
            lo, hi = (int(x) for x in args.rounds.split("-"))
        except ValueError:
            p.error(f"--rounds {args.rounds!r}: two round numbers, e.g. 89-98")
        a, b = rounds(Path(args.runs[0])), rounds(Path(args.same_as))
        keys = ("val_ppl", "loss", "bytes_total")
        differ = [
            r
            for r in range(lo, hi + 1)
            if r not in a or r not in b or any(a[r].get(k) != b[r].get(k) for k in keys)
        ]
        if differ:
            print(f"differ in rounds {differ}")
            return 1
        print(
            f"rounds {lo}-{hi}: the same {', '.join(keys)} in every round ({a[lo]['val_ppl']:.2f} ... {a[hi]['val_ppl']:.2f})"
        )
        return 0
    every = [(Path(run), rounds(Path(run))) for run in args.runs]  # all read before a line is printed
    print("| run | final | lowest (round) | mean of the last five |\n|---|---|---|---|")
    for run, evs in every:
        ppl = [evs[r]["val_ppl"] for r in sorted(evs)]
        low = min(evs, key=lambda r: evs[r]["val_ppl"])
        print(
            f"| {run.name} | {ppl[-1]:.2f} | {evs[low]['val_ppl']:.2f} ({low} of {max(evs)}) | {statistics.mean(ppl[-5:]):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
