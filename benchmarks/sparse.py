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

The runs are grouped by what else they vary (the method and its inner optimizer: ``diloco-int4-muon`` is
the int4 run of ``diloco-muon``), each group's wires side by side; a run's wire is read from its config.

Usage:  python benchmarks/sparse.py --config configs/bench-cpu-sparse.yaml --out bench-sparse [--resume]
        python benchmarks/sparse.py --report-only bench-sparse [--target 450] [--plot sparse.png]
        python benchmarks/sparse.py --config configs/compress-long-tiny-stdlib.yaml --methods adloco,... --out DIR
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
CODECS = ("int8", "int4", "topk", "bfloat16", "float16")  # a variant's name part that names its wire
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
        if variant and seed.isdigit():
            runs.setdefault(variant, {})[int(seed)] = results.load(path)
    return runs


def group(variant: str) -> str:
    """What a variant varies besides its wire: its name without the codec's part (diloco-int4-muon ->
    diloco-muon)."""
    return "-".join(p for p in variant.split("-") if p not in CODECS)


def wire(run: results.Run) -> str:
    """The wire of Δ a run used, from its config (error feedback and, for topk, its keys)."""
    comm = run.config.get("comm") or {}
    dtype = str(comm.get("dtype", "float32"))
    if dtype == "float32":
        return "float32"
    from adloco.library.settings import Wire

    keys = {k: v for k, v in comm.items() if k in {f for f in Wire.__dataclass_fields__} and v is not None}
    try:
        w = Wire(**{k: _num(v) for k, v in keys.items()})
    except (TypeError, ValueError):
        return dtype
    fb = f" + error feedback{f' (β {w.decay:g})' if w.decay != 1 else ''}" if w.feedback else ""
    if dtype == "topk":
        return f"topk ({w.topk_fraction * w.topk_block:g} of {w.topk_block}, {w.topk_bits} bits){fb}"
    return f"{dtype}{fb}"


def _num(v: Any) -> Any:
    """A config value as written (the run's config.yaml holds some numbers as strings)."""
    if isinstance(v, str):
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
        return {"true": True, "false": False}.get(v, v)
    return v


def ordered(runs: dict[str, dict[int, results.Run]]) -> list[str]:
    """Variants by group, then float32, int4, topk, others."""
    rank = {c: i for i, c in enumerate(("", "int8", "int4", "topk"))}
    return sorted(runs, key=lambda v: (group(v), rank.get(v.replace(group(v), "").strip("-"), 9), v))


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
    names = ordered(runs)
    for g in dict.fromkeys(group(v) for v in names):
        mine = {v: runs[v] for v in names if group(v) == g}
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
            rows.append(
                f"| {variant} | {wire(rs[0])} | {len(rs)} | {cell([r.final for r in rs])} | "
                f"{mb(statistics.fmean(r.end.bytes for r in rs if r.end))} | "
                f"{cell([at_bytes(r, budget) for r in rs])} at {mb(budget)} | "
                f"{cell([p.bytes / 1e6 if p else None for p in reached], '{:,.1f} MB')} | "
                + " | ".join(cell(t, "{:,.0f} s") for t in times)
                + " |"
            )
    return "\n".join(rows)


def plot(path: Path, runs: dict[str, dict[int, results.Run]], target: float) -> None:
    """Perplexity against bytes sent (log scale), one panel per group (method and inner optimizer), each
    run a line, coloured by its wire."""
    from matplotlib.figure import Figure

    names = ordered(runs)
    groups = list(dict.fromkeys(group(v) for v in names))
    cols = min(len(groups), 2)
    rows_n = -(-len(groups) // cols)
    fig = Figure(figsize=(5 * cols, 4.2 * rows_n))
    colors = {"float32": "C0", "int4": "C1", "topk": "C2"}
    for i, g in enumerate(groups):
        ax = fig.add_subplot(rows_n, cols, i + 1)
        seen: set[str] = set()
        for variant in [v for v in names if group(v) == g]:
            for _seed, r in sorted(runs[variant].items()):
                label = wire(r)
                kind = label.split(" ")[0]
                pts = [p for p in r.points if p.bytes > 0]
                ax.plot(
                    [p.bytes for p in pts],
                    [p.value for p in pts],
                    color=colors.get(kind, "C3"),
                    alpha=0.8,
                    linewidth=1,
                    label=label if label not in seen else None,
                )
                seen.add(label)
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bytes on the wire (cumulative)")
        ax.set_ylabel("validation perplexity")
        ax.set_title(g, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", help="the bench's config (configs/bench-cpu-sparse.yaml or its 10m twin)")
    p.add_argument("--methods", default=",".join(VARIANTS), help="the bench's variants (with --config)")
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
                args.methods,
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
            raise UserError(f"sparse: {str(out)!r}: no finished run of an adloco bench")
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
