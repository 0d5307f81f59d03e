"""Communication behind compute on an emulated link: DiLoCo and AdLoCo with ``sync.overlap`` none, delayed
and eager, streaming fragments (4, τ = 1), and torchft's published defaults, on a link held back to
10 or 100 Mbit/s (``network.emulate``, ALGORITHM.md §7 and ALGORITHM.md §13).

Each run is an ordinary ``adloco train --nproc 2`` (2 workers, 2 gloo processes on loopback, one thread
each) on ``configs/bench-cpu-lr.yaml``'s llama-tiny and data, each method at its tuned settings
(benchmarks/RESULTS.md), with a budget of training examples. For every variant the table gives, over the
seeds, mean [min–max] of: the final validation perplexity; wall-clock time (the rounds' ``round_s``:
what a user waits, the evaluation every round included, alike for every variant) and simulated time, to
the target and for the whole run; the wall time of training alone (``train_s``: a collective behind
compute runs on while the round is evaluated, which neither this nor simulated time counts); the peak bytes of one
Δ collective; and the share of communication hidden behind compute, measured (1 − the seconds the
workers waited for collectives / the seconds the collectives took) and simulated (1 − the network time
simulated time charged / what every collective costs on the link). The target is ``--target``, or the
highest final perplexity of any run of the table (so that every run reaches it); a seed that never
reaches the target is left out of that column's mean, and the seeds that did are counted.

Emulated links are real sleeping, so wall time is what a user waits: run nothing else meanwhile.
Usage:  python benchmarks/overlap.py [--mbits 10,100] [--seeds 0,1,2] [--budget 2048] [--target PPL]
                                     [--variants diloco-none,...] [--out benchmarks/out/overlap]
                                     [--plot overlap.png]
        python benchmarks/overlap.py --report-only [--out ...]   (the table again, from finished runs)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from adloco import netmodel  # noqa: E402
from adloco.bench.runner import Train  # noqa: E402

DILOCO = [
    "algorithm.method=diloco",
    "outer.optimizer=nesterov",
    "outer.lr=0.5",
    "outer.momentum=0.0",
    "inner.lr=0.004",
]
ADLOCO = [
    "algorithm.method=adloco",
    "algorithm.trainers=2",
    "outer.optimizer=average",
    "batch.eta=0.8",
    "inner.lr=0.002",
    "batch.lr_scaling=gain",
]
STREAM = ["sync.fragments=4", "sync.fragment_delay=1"]
VARIANTS: dict[str, list[str]] = {
    **{
        f"{m}-{o}": [*base, f"sync.overlap={o}"]
        for m, base in (("diloco", DILOCO), ("adloco", ADLOCO))
        for o in ("none", "delayed", "eager")
    },
    "diloco-stream4": [*DILOCO, *STREAM],
    # does a smaller outer step make up for the staleness? (DiLoCo's tuned lr halved; run only when named)
    **{f"diloco-{o}-lr0.25": [*DILOCO, "outer.lr=0.25", f"sync.overlap={o}"] for o in ("delayed", "eager")},
    "adloco-stream4": [*ADLOCO, *STREAM],
    # torchft's published defaults: outer Nesterov lr 0.7, momentum 0.9, fragments with delay 0 and α 0
    "torchft-defaults": [
        "algorithm.method=diloco",
        "outer.optimizer=nesterov",
        "outer.lr=0.7",
        "outer.momentum=0.9",
        "inner.lr=0.004",
        "sync.fragments=4",
    ],
}
ORDER = [
    "diloco-none",
    "diloco-delayed",
    "diloco-eager",
    "diloco-stream4",
    "diloco-delayed-lr0.25",
    "diloco-eager-lr0.25",
    "torchft-defaults",
    "adloco-none",
    "adloco-delayed",
    "adloco-eager",
    "adloco-stream4",
]


def run(out: Path, name: str, mbit: int, seed: int, budget: int) -> Path:
    folder = out / f"{mbit}mbit" / f"{name}-s{seed}"
    if (folder / "summary.json").exists():
        return folder
    sets = [
        *VARIANTS[name],
        "algorithm.workers=2",
        f"algorithm.seed={seed}",
        f"algorithm.budget={budget}",
        "algorithm.rounds=200",
        "runtime.threads=1",
        "network.emulate=true",
        f"network.bandwidth={mbit * 1e6 / 8:g}",
        "network.latency=0.01",
        "logging.progress=off",
        "logging.plots=false",
    ]
    train = Train(
        sets, folder.parent, folder.name, config=ROOT / "configs/bench-cpu-lr.yaml", nproc=2, cwd=ROOT
    )
    print(" ".join(train.argv[2:]), flush=True)
    train.run(stdout=subprocess.DEVNULL, stderr=None).folder.rename(folder)
    return folder


def measure(folder: Path, mbit: int) -> dict[str, Any]:
    events = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    rounds = [e for e in events if e["event"] == "round"]
    summary = json.loads((folder / "summary.json").read_text())
    bw, lat = mbit * 1e6 / 8, 0.01
    wall, with_eval, sim, curve = 0.0, 0.0, 0.0, []
    exposed_s = took_s = exposed_sim = total_sim = 0.0
    peak = 0
    for e in rounds:
        wall += e["train_s"]
        with_eval += e["round_s"]
        sim += e["sim_s"]
        curve.append((with_eval, sim, e["val_ppl"]))
        behind = e.get("collectives_behind", [])
        took_s += e["comm_s"] - e.get("wait_s", 0.0) + e.get("behind_s", 0.0)
        exposed_s += e["comm_s"]
        total_sim += netmodel.comm_seconds(e["collectives"] + [r[:5] for r in behind], bw, lat)
        exposed_sim += e["sim_s"] - e["max_compute_s"]
        peak = max([peak] + [r[3] for r in e["collectives"] + behind if r[0] == "delta"])
    return {
        "final_ppl": summary["final_val_ppl"],
        "rounds": summary["rounds"],
        "wall_s": wall,
        "wall_eval_s": with_eval,
        "sim_s": sim,
        "curve": curve,
        "peak_bytes": peak,
        "bytes": summary["bytes_total"],
        "hidden_wall": max(0.0, 1 - exposed_s / took_s) if took_s else 0.0,
        "hidden_sim": max(0.0, 1 - exposed_sim / total_sim) if total_sim else 0.0,
    }


def to_target(curve: list[tuple[float, float, float]], target: float) -> tuple[float, float] | None:
    for wall, sim, ppl in curve:
        if ppl is not None and ppl <= target:
            return wall, sim
    return None


def spread(xs: list[float], fmt: str) -> str:
    if not xs:
        return "–"
    if len(xs) == 1:
        return format(xs[0], fmt)
    return f"{format(statistics.mean(xs), fmt)} [{format(min(xs), fmt)}–{format(max(xs), fmt)}]"


def table(out: Path, mbit: int, target: float | None) -> str:
    got: dict[str, list[dict[str, Any]]] = {}
    for folder in sorted((out / f"{mbit}mbit").glob("*-s*")):
        if (folder / "summary.json").exists():
            name = folder.name.rsplit("-s", 1)[0]
            got.setdefault(name, []).append(measure(folder, mbit))
    if not got:
        return ""
    goal = target or max(m["final_ppl"] for ms in got.values() for m in ms)
    lines = [
        f"{mbit} Mbit/s, target perplexity {goal:.1f}",
        "",
        "| variant | seeds | final ppl | wall → target | sim. → target | wall, run | wall, training only | sim., run | peak MB / collective | hidden, wall | hidden, sim. |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in [n for n in ORDER if n in got]:
        ms = got[name]
        hit = [to_target(m["curve"], goal) for m in ms]
        reached = [h for h in hit if h is not None]
        # seeds that never reached the target are left out of the mean, and counted
        some = "" if len(reached) == len(ms) else f" ({len(reached)} of {len(ms)} seeds)"
        wall_t = f"{spread([h[0] for h in reached], '.1f')} s{some}" if reached else "not reached"
        sim_t = f"{spread([h[1] for h in reached], '.1f')} s{some}" if reached else "not reached"
        lines.append(
            f"| {name} | {len(ms)} | {spread([m['final_ppl'] for m in ms], '.1f')} "
            f"| {wall_t} | {sim_t} | {spread([m['wall_eval_s'] for m in ms], '.1f')} s "
            f"| {spread([m['wall_s'] for m in ms], '.1f')} s | {spread([m['sim_s'] for m in ms], '.1f')} s "
            f"| {spread([m['peak_bytes'] / 1e6 for m in ms], '.2f')} "
            f"| {spread([100 * m['hidden_wall'] for m in ms], '.0f')}% | {spread([100 * m['hidden_sim'] for m in ms], '.0f')}% |"
        )
    return "\n".join(lines)


def plot(out: Path, mbits: list[int], path: Path) -> None:
    """Validation perplexity against wall-clock time (evaluations included), seed 0 of every variant, one
    panel a link."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(mbits), figsize=(6 * len(mbits), 4.5), squeeze=False)
    for ax, mbit in zip(axes[0], mbits, strict=True):
        for name in ORDER:
            folder = out / f"{mbit}mbit" / f"{name}-s0"
            if not (folder / "summary.json").exists():
                continue
            curve = measure(folder, mbit)["curve"]
            style = "--" if name.startswith("adloco") else "-"
            color = plt.get_cmap("tab20")(ORDER.index(name) % 20)  # the same in every panel
            ax.plot([c[0] for c in curve], [c[2] for c in curve], style, label=name, marker=".", color=color)
        ax.set_yscale("log")
        ax.set_xlabel("wall-clock seconds, evaluation included (link emulated)")
        ax.set_ylabel("validation perplexity")
        ax.set_title(f"{mbit} Mbit/s, seed 0")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/out/overlap")
    ap.add_argument("--mbits", default="10,100")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--target", type=float)
    ap.add_argument("--variants", default=",".join(n for n in ORDER if not n.endswith("-lr0.25")))
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--plot", type=Path, help="draw perplexity against wall time (seed 0) into this PNG")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    mbits = [int(x) for x in args.mbits.split(",")]
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"overlap: --variants: unknown {', '.join(unknown)} (known: {', '.join(ORDER)})")
    if not args.report_only:
        for mbit in mbits:
            for seed in [int(s) for s in args.seeds.split(",")]:
                for name in names:
                    run(out, name, mbit, seed, args.budget)
    for mbit in mbits:
        print(table(out, mbit, args.target), "\n", flush=True)
    if args.plot:
        plot(out, mbits, args.plot)


if __name__ == "__main__":
    main()
