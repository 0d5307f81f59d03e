"""At which link speed does AdLoCo reach the target sooner than DiLoCo? Finished benches re-priced for
several simulated links; nothing is re-run.

Each BENCH is a folder holding an `adloco bench` results.json (a bench, or its `--report-only` copy with
the target and compute price it was given). Its target, seconds per example and latency are read from
that file; every run of the two variants compared (default: adloco over diloco) is loaded once and its
simulated time re-priced at each bandwidth (ALGORITHM.md §7). For every link and bench the table gives
the ratio of the two variants' simulated time to the target, per seed, as mean [min–max]: below 1,
the first variant is sooner on every seed counted. `--plot FILE` draws the same ratios against the link.
`--profile PATH|auto` prices compute by a step-time profile instead of the bench's seconds per example
(ALGORITHM.md §11; auto: fitted from the bench's own runs), optionally at `--fixed-share PHI`.

Usage:  python benchmarks/link_speed.py BENCH [BENCH ...] [--mbits 100,50,25,10] [--plot link_speed.png]
                                        [--profile profile.json [--fixed-share 0.5]]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from adloco import bench
from adloco.errors import UserError
from adloco.report import results


def _load_bench(folder: Path, variants: tuple[str, str]) -> tuple[dict[str, Any], dict[str, dict[int, Any]]]:
    doc = bench.read_results(folder, "link_speed:")
    if (
        doc["target"] is None
        or (doc.get("compute") or {}).get("mode") != "examples"
        or not doc.get("network")
    ):
        raise UserError(
            f"link_speed: {str(folder)!r}: needs a target and --compute examples (re-run with --report-only)"
        )
    by_name = {v["name"]: v for v in doc["variants"]}
    runs: dict[str, dict[int, Any]] = {}
    for name in variants:
        if name not in by_name:
            raise UserError(f"link_speed: {str(folder)!r}: no variant {name!r} (it has {', '.join(by_name)})")
        runs[name] = {
            e["seed"]: results.load(e["folder"]) for e in by_name[name]["runs"] if e["status"] == "ok"
        }
    return doc, runs


def ratios(
    doc: dict[str, Any],
    runs: dict[str, dict[int, Any]],
    variants: tuple[str, str],
    bandwidth: float,
    profile: Any = None,
) -> list[float]:
    """Per seed (those where both variants reached the target): first variant's simulated time to the
    target over the second's, every run priced at ``bandwidth`` bytes/s and the bench's compute price (or
    ``profile``, a :class:`adloco.profile.StepProfile`)."""
    spe, latency, target = doc["compute"]["seconds_per_example"], doc["network"]["latency"], doc["target"]
    reached: dict[str, dict[int, float]] = {}
    for name in variants:
        reached[name] = {}
        for seed, run in runs[name].items():
            run.bandwidth, run.latency = bandwidth, latency
            if profile is not None:
                results.price([run], profile=profile)
            else:
                results.price([run], "examples", spe)
            point = results.reach(run, target)
            if point is not None:
                reached[name][seed] = point.sim_s
    a, b = variants
    return [
        reached[a][s] / reached[b][s] for s in sorted(reached[a]) if s in reached[b] and reached[b][s] > 0
    ]


def bench_profile(runs: dict[str, dict[int, Any]], profile: str | None, fixed_share: float | None) -> Any:
    """The step-time profile a bench is priced by: a file, ``auto`` (fitted from all its runs' rounds), or
    None (its seconds per example); at ``fixed_share`` when given."""
    if profile is None:
        return None
    from adloco.profile import StepProfile

    everyone = [run for by_seed in runs.values() for run in by_seed.values()]
    prof = results.fit_profile(everyone) if profile == "auto" else StepProfile.load(profile)
    if fixed_share is not None:
        prof = prof.with_fixed_share(fixed_share, results.first_request(everyone))
    return prof


def _cell(rs: list[float]) -> str:
    if not rs:
        return "not reached"
    return f"{statistics.fmean(rs):.2f} [{min(rs):.2f}–{max(rs):.2f}]"


def _label(
    doc: dict[str, Any], runs: dict[str, dict[int, Any]], variants: tuple[str, str], prof: Any = None
) -> str:
    """The column's name: the model, its seeds, and how compute was priced (the bench's seconds per
    example, or the profile's α, β, δ and its fixed share at the first request)."""
    first = next(iter(runs[variants[0]].values()), None)
    model = (first.config.get("model") or {}).get("name", "?") if first else "?"
    seeds = len(runs[variants[0]])
    if prof is None:
        price = f"{doc['compute']['seconds_per_example'] * 1e3:.1f} ms per example"
    else:
        b0 = results.first_request([r for by_seed in runs.values() for r in by_seed.values()])
        price = (
            f"profile α {prof.alpha * 1e3:.1f} ms, β {prof.beta * 1e3:.1f} ms/row, δ {prof.delta * 1e3:.1f} ms, "
            f"φ {prof.fixed_share(b0):.2f} at b₀ {b0}"
        )
    return f"`{model}`, {seeds} seed{'s' if seeds != 1 else ''} ({price})"


def plot(
    path: Path,
    xs: list[float],
    columns: list[tuple[str, list[list[float]]]],
    variants: tuple[str, str],
    xlabel: str = "simulated link, Mbit/s",
    log_x: bool = True,
) -> None:
    """Each column's per-seed ratios at every x (a list per x; empty where not reached) as its mean line
    with a min–max band; 1 dashed (below it the first variant is sooner). fixed_share.py draws with it."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2))
    ax = fig.add_subplot()
    for label, per_x in columns:
        reached = [(x, rs) for x, rs in zip(xs, per_x, strict=True) if rs]
        line = ax.plot(
            [x for x, _ in reached],
            [statistics.fmean(rs) for _, rs in reached],
            marker="o",
            label=label.replace("`", ""),
        )[0]
        ax.fill_between(
            [x for x, _ in reached],
            [min(rs) for _, rs in reached],
            [max(rs) for _, rs in reached],
            color=line.get_color(),
            alpha=0.2,
            linewidth=0,
        )
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    if log_x:
        ax.set_xscale("log")
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"time to target, {variants[0]} / {variants[1]}")
    ax.set_title(
        f"below 1: {variants[0]} reaches the target sooner (mean, min–max band over seeds)", fontsize=9
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("benches", nargs="+", type=Path, help="folders holding an adloco bench results.json")
    p.add_argument("--mbits", default="100,50,25,10", help="simulated links in Mbit/s, comma-separated")
    p.add_argument("--variants", default="adloco,diloco", help="the two variants compared: A,B (ratio A / B)")
    p.add_argument("--plot", type=Path, help="draw the ratios against the link into this PNG")
    p.add_argument("--profile", help="price compute by this step-time profile (adloco profile), or auto")
    p.add_argument("--fixed-share", type=float, help="with --profile: at this fixed-cost share PHI")
    args = p.parse_args(argv)
    try:
        try:
            mbits = [float(x) for x in args.mbits.split(",")]
        except ValueError:
            raise UserError(f"link_speed: --mbits {args.mbits!r}: comma-separated positive numbers") from None
        if not mbits or not all(m > 0 for m in mbits):
            raise UserError(f"link_speed: --mbits {args.mbits!r}: comma-separated positive numbers")
        pair = tuple(v.strip() for v in args.variants.split(","))
        if len(pair) != 2 or not all(pair):
            raise UserError(f"link_speed: --variants {args.variants!r}: two variant names, A,B")
        variants = (pair[0], pair[1])
        if args.fixed_share is not None and args.profile is None:
            raise UserError("link_speed: --fixed-share: needs --profile")
        columns = []
        for folder in args.benches:
            doc, runs = _load_bench(folder, variants)
            prof = bench_profile(runs, args.profile, args.fixed_share)
            label = _label(doc, runs, variants, prof)
            columns.append((label, [ratios(doc, runs, variants, m * 1e6 / 8, prof) for m in mbits]))
    except UserError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"Simulated time to the target, {variants[0]} / {variants[1]}, per seed: mean [min–max].\n")
    print("| link | " + " | ".join(label for label, _ in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for i, m in enumerate(mbits):
        print(f"| {m:g} Mbit/s | " + " | ".join(_cell(per_link[i]) for _, per_link in columns) + " |")
    if args.plot:
        plot(args.plot, mbits, columns, variants)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
