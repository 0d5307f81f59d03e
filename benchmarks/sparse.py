"""The sparse codec (comm.dtype: topk) against int4 and float32 for AdLoCo and DiLoCo: bytes on the wire,
final perplexity, perplexity at equal bytes, and time to a target on modelled 10 and 100 Mbit/s links.

One command runs the comparison (an `adloco bench` of six variants: each method as float32, int4 with
error feedback, topk; configs/bench-cpu-sparse.yaml and configs/bench-cpu-10m-sparse.yaml) and prints
the table; `--report-only` makes the table of a bench that ran (or is running: finished runs only)
without running anything. Equal bytes, read two ways from the same runs:

- at matched bytes: each run's validation perplexity once it has sent B* bytes, B* the whole-run bytes
  of the method's sparsest variant (mean over its seeds): the last evaluation whose cumulative bytes are
  at most B* (the initial model's if its first round already sent more);
- bytes to a target: the bytes sent until the first evaluation at or below the target perplexity.

Time to the target prices each worker's compute as its examples times one constant (`--seconds-per-
example`; by default the quiet one-core CPU price of benchmarks/cpu_price.py for the bench's model), so
the machine's load does not enter, and every counted collective on the link (ALGORITHM.md §7). Cells
are means over seeds [min–max]. `--plot FILE` draws perplexity against bytes, one panel per method.

Usage:  python benchmarks/sparse.py --config configs/bench-cpu-sparse.yaml --out bench-sparse [--resume]
        python benchmarks/sparse.py --report-only bench-sparse [--target 450] [--plot sparse.png]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from adloco.errors import UserError
from adloco.report import results

VARIANTS = ["adloco", "adloco-int4", "adloco-topk", "diloco", "diloco-int4", "diloco-topk"]
WIRE = {
    "": "float32",
    "int4": "int4 + error feedback",
    "topk": "topk (1/64 of 4096, 2 bits) + error feedback",
}
# seconds of one core per training example (benchmarks/cpu_price.py; RESULTS.md, "Does AdLoCo pay")
PRICE = {"llama-tiny": 0.0241, "llama-10m": 0.1181}


def finished(out: Path) -> dict[str, dict[int, results.Run]]:
    """Every finished run of the bench in ``out`` (a summary.json written), by variant and seed; of a
    task run twice (a resumed bench), the latest."""
    runs: dict[str, dict[int, results.Run]] = {}
    for path in sorted((out / "runs").glob("*-s*-*")):
        if not (path / "summary.json").is_file():
            continue
        name = yaml.safe_load((path / "config.yaml").read_text()).get("logging", {}).get("name", "")
        variant, _, seed = str(name).rpartition("-s")
        if variant in VARIANTS and seed.isdigit():
            runs.setdefault(variant, {})[int(seed)] = results.load(path)
    return runs


def cell(values: Sequence[float | None], fmt: str = "{:.1f}") -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "not reached"
    text = fmt.format(statistics.fmean(got))
    if len(got) > 1:
        text += f" [{fmt.format(min(got))}–{fmt.format(max(got))}]"
    if len(got) < len(values):
        text += f" ({len(got)} of {len(values)})"
    return text


def mb(x: float) -> str:
    return f"{x / 1e6:,.1f} MB" if x < 1e9 else f"{x / 1e9:,.2f} GB"


def at_bytes(run: results.Run, budget: float) -> float:
    """The perplexity of the run's last evaluation having sent at most ``budget`` bytes."""
    return [p for p in run.points if p.bytes <= budget][-1].value


def table(runs: dict[str, dict[int, results.Run]], target: float, spe: float, mbits: Sequence[float]) -> str:
    rows = [
        "| variant | wire of Δ | seeds | final ppl | bytes, whole run | ppl at the sparsest's bytes | "
        "bytes → target | " + " | ".join(f"time → target, {m:g} Mbit/s" for m in mbits) + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(mbits),
    ]
    for method in ("adloco", "diloco"):
        mine = {v: runs[v] for v in VARIANTS if v.split("-")[0] == method and v in runs}
        if not mine:
            continue
        budget = min(
            statistics.fmean(r.end.bytes for r in by_seed.values() if r.end) for by_seed in mine.values()
        )
        for variant, by_seed in mine.items():
            rs = [by_seed[s] for s in sorted(by_seed)]
            times = []
            for m in mbits:
                for r in rs:
                    r.bandwidth = m * 1e6 / 8
                results.price(rs, "examples", spe)
                times.append([p.sim_s if (p := results.reach(r, target)) else None for r in rs])
            reached = [results.reach(r, target) for r in rs]
            wire = WIRE[variant.partition("-")[2]]
            rows.append(
                f"| {variant} | {wire} | {len(rs)} | {cell([r.final for r in rs])} | "
                f"{mb(statistics.fmean(r.end.bytes for r in rs if r.end))} | "
                f"{cell([at_bytes(r, budget) for r in rs])} at {mb(budget)} | "
                f"{cell([p.bytes / 1e6 if p else None for p in reached], '{:,.1f} MB')} | "
                + " | ".join(cell(t, "{:,.0f} s") for t in times)
                + " |"
            )
    return "\n".join(rows)


def plot(path: Path, runs: dict[str, dict[int, results.Run]], target: float) -> None:
    """Perplexity against bytes sent (log scale), one panel per method, each run a line."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2))
    colors = {"": "C0", "int4": "C1", "topk": "C2"}
    for i, method in enumerate(("adloco", "diloco")):
        ax = fig.add_subplot(1, 2, i + 1)
        for variant in [v for v in VARIANTS if v.split("-")[0] == method and v in runs]:
            codec = variant.partition("-")[2]
            for j, (_seed, r) in enumerate(sorted(runs[variant].items())):
                pts = [p for p in r.points if p.bytes > 0]
                ax.plot(
                    [p.bytes for p in pts],
                    [p.value for p in pts],
                    color=colors[codec],
                    alpha=0.8,
                    linewidth=1,
                    label=WIRE[codec].split(" (")[0] if j == 0 else None,
                )
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bytes on the wire (cumulative)")
        ax.set_ylabel("validation perplexity")
        ax.set_title(method, fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", help="the bench's config (configs/bench-cpu-sparse.yaml or its 10m twin)")
    p.add_argument("--out", type=Path, help="the bench's folder (with --config: where it runs)")
    p.add_argument("--resume", action="store_true", help="go on with an unfinished bench in --out")
    p.add_argument("--set", dest="extra", action="append", default=[], help="more --set for every run")
    p.add_argument("--report-only", type=Path, metavar="BENCH_DIR", help="run nothing: the table of its runs")
    p.add_argument("--target", type=float, help="perplexity to reach (default: the highest final one)")
    p.add_argument("--seconds-per-example", type=float, help="compute price (default: the model's, quiet)")
    p.add_argument("--mbits", default="10,100", help="modelled links, Mbit/s, comma-separated")
    p.add_argument("--plot", type=Path, help="draw perplexity against bytes into this PNG")
    args = p.parse_args(argv)
    try:
        if args.report_only is not None:
            out = args.report_only
        elif args.config and args.out:
            out = args.out
            cmd = [
                sys.executable,
                "-m",
                "adloco",
                "bench",
                "--config",
                args.config,
                "--methods",
                ",".join(VARIANTS),
            ]
            cmd += ["--out", str(out), *(["--resume"] if args.resume else [])]
            for s in ["runtime.threads=1", *args.extra]:
                cmd += ["--set", s]
            print("$", " ".join(cmd), flush=True)
            if subprocess.run(cmd).returncode != 0:
                print(
                    "sparse: the bench did not finish every run; the table holds those that did",
                    file=sys.stderr,
                )
        else:
            raise UserError("sparse: give --config and --out (run the bench), or --report-only BENCH_DIR")
        try:
            mbits = [float(x) for x in args.mbits.split(",")]
        except ValueError:
            mbits = []
        if not mbits or not all(m > 0 for m in mbits):
            raise UserError(f"sparse: --mbits {args.mbits!r}: comma-separated positive numbers")
        runs = finished(out)
        if not runs:
            raise UserError(f"sparse: {str(out)!r}: no finished run of {', '.join(VARIANTS)}")
        first: Any = next(iter(next(iter(runs.values())).values()))
        model = str((first.config.get("model") or {}).get("name", "?"))
        spe = args.seconds_per_example or PRICE.get(model)
        if spe is None:
            raise UserError(f"sparse: no quiet price known for {model!r}: give --seconds-per-example")
        target = args.target or max(r.final for by_seed in runs.values() for r in by_seed.values())
    except UserError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(
        f"`{model}`, target {target:.1f}, compute {spe * 1e3:.1f} ms per example, latency "
        f"{first.latency * 1e3:g} ms; cells: mean [min–max] over seeds\n"
    )
    print(table(runs, target, spe, mbits))
    if args.plot:
        plot(args.plot, runs, target)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
