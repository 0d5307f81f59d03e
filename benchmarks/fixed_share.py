"""At which fixed-cost share of a step would AdLoCo reach the target sooner than DiLoCo? A finished bench
re-priced by step-time profiles that differ only in their fixed-cost share φ (ALGORITHM.md §11); nothing is
re-run.

A profile t(m, a) = a·(α + β·m) + δ (``adloco profile``, or ``auto``: fitted from the bench's own runs) is
re-split at each φ so that a micro-batch of the first request b₀ costs what it costs in the profile, with
φ of it fixed: α = φ·s, β = (1 − φ)·s/b₀. At φ → 0 a step costs its rows (the old per-example price: a
bigger batch is never cheaper per example); near 1 a step costs the same whatever its rows (a GPU running
a small model). For every φ and link the table gives the first variant's simulated time to the bench's
target over the second's, per seed, as mean [min–max]; `--plot FILE` draws them against φ.

A re-priced run keeps the micro-batches it ran: a request above the run's b_max was accumulated (or
capped) there, which a device with a larger b_max would not do. Say which b_max the bench ran at.

Usage:  python benchmarks/fixed_share.py BENCH --profile profile.json|auto [--phi 0.1,0.3,0.5,0.7,0.9]
                                         [--mbits 100,25] [--plot fixed_share.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from link_speed import _cell, _load_bench, bench_profile, plot, ratios

from adloco.errors import UserError
from adloco.report import results


def _grid_runs(doc: dict[str, Any], variant: str) -> list[tuple[str, Any]]:
    """The finished runs of the grid of ``variant``'s method, with their settings' text."""
    method = next(v["method"] for v in doc["variants"] if v["name"] == variant)
    rows = [r for r in doc["grids"].get(method, []) if r.get("status") == "ok" and r.get("folder")]
    if not rows:
        raise UserError(f"fixed_share: --fastest-b: {variant}'s method {method!r} has no grid in this bench")
    return [(r["setting_text"], results.load(r["folder"])) for r in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench", type=Path, help="a folder holding an adloco bench results.json")
    p.add_argument("--profile", required=True, help="a step-time profile (adloco profile), or auto")
    p.add_argument("--phi", default="0.1,0.3,0.5,0.7,0.8,0.9", help="fixed-cost shares, comma-separated")
    p.add_argument("--mbits", default="100,25", help="simulated links in Mbit/s, comma-separated")
    p.add_argument("--variants", default="adloco,diloco", help="the two variants compared: A,B (ratio A / B)")
    p.add_argument("--plot", type=Path, help="draw the ratios against φ into this PNG")
    p.add_argument(
        "--fastest-b",
        action="store_true",
        help="compare with B's method at whichever setting of its grid (first seed) reaches the target "
        "soonest at each φ and link: on a device with a large fixed cost a larger constant batch is the "
        "fair baseline",
    )
    args = p.parse_args(argv)
    try:
        try:
            phis = [float(x) for x in args.phi.split(",")]
            mbits = [float(x) for x in args.mbits.split(",")]
        except ValueError:
            raise UserError("fixed_share: --phi and --mbits: comma-separated numbers") from None
        if not phis or not all(0 <= x < 1 for x in phis) or not mbits or not all(m > 0 for m in mbits):
            raise UserError("fixed_share: --phi: numbers in [0, 1); --mbits: positive numbers")
        pair = tuple(v.strip() for v in args.variants.split(","))
        if len(pair) != 2 or not all(pair):
            raise UserError(f"fixed_share: --variants {args.variants!r}: two variant names, A,B")
        variants = (pair[0], pair[1])
        doc, runs = _load_bench(args.bench, variants)
        base = bench_profile(runs, args.profile, None)
        b0 = results.first_request([r for by_seed in runs.values() for r in by_seed.values()])
        curves: dict[float, list[list[float]]] = {m: [] for m in mbits}
        chosen: dict[float, list[str]] = {m: [] for m in mbits}
        grid = _grid_runs(doc, variants[1]) if args.fastest_b else []
        for phi in phis:
            prof = base.with_fixed_share(phi, b0)
            for m in mbits:
                if not grid:
                    curves[m].append(ratios(doc, runs, variants, m * 1e6 / 8, prof))
                    continue
                a, b = variants
                first = {s: r for s, r in runs[a].items() if s == min(runs[a])}
                tried = [
                    (ratios(doc, {a: first, b: {min(first): g}}, variants, m * 1e6 / 8, prof), text)
                    for text, g in grid
                ]
                best = max((t for t in tried if t[0]), key=lambda t: t[0][0], default=([], "none"))
                curves[m].append(best[0])
                chosen[m].append(best[1])
    except UserError as exc:
        print(exc, file=sys.stderr)
        return 2
    ran = [run for by_seed in runs.values() for run in by_seed.values()]
    micro = max((int(getattr(e, "micro", 0) or 0) for run in ran for e in run.events), default=0)
    print(
        f"Simulated time to the target, {variants[0]} / {variants[1]}, per seed: mean [min–max]; profile "
        f"{base.source}, its own φ at b₀ = {b0}: {base.fixed_share(b0):.2f}; the largest micro-batch the "
        f"runs ran (their b_max, where a request passed it): {micro}.\n"
    )
    if args.fastest_b:
        print(
            f"{variants[1]} at the fastest setting of its grid on seed {min(runs[variants[0]])}, per cell.\n"
        )
    print("| φ | " + " | ".join(f"{m:g} Mbit/s" for m in mbits) + " |")
    print("|---|" + "---|" * len(mbits))
    for i, phi in enumerate(phis):
        cells = [_cell(curves[m][i]) + (f" ({chosen[m][i]})" if args.fastest_b else "") for m in mbits]
        print(f"| {phi:g} | " + " | ".join(cells) + " |")
    if args.plot:
        columns = [(f"{m:g} Mbit/s", per_phi) for m, per_phi in curves.items()]
        plot(
            args.plot,
            phis,
            columns,
            variants,
            "fixed-cost share φ of a step at the first request",
            log_x=False,
        )
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
