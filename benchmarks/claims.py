"""The paper's claims, one by one, against a finished `adloco bench` (its results.json).

For every claim, a ratio of two variants' figures on the same seed (AdLoCo over the other: below 1 means
AdLoCo is lower), its mean and min–max over the seeds both ran, and a verdict: *confirmed* when the
ratio is on the claim's side of 1 on every seed, *refuted* when it is on the other side on every seed,
*mixed* otherwise; *no difference* when the two are equal on every seed; *not shown* when a figure is missing (a run that never reached the target).

Several results.json (benches priced alike: the same target, network and seconds per example; see
`adloco bench --report-only`) are read as one: a later file's variant replaces an earlier one of the same
name, and a replaced `adloco` takes the earlier file's ablations with it (they ablated another AdLoCo).

With `--column LABEL FILES` (repeatable; FILES one results.json or several joined by commas, read as
one as above) the table has a column per bench, say per model size and corpus, each cell the ratio's
mean [min–max] over the seeds and its verdict; claims that no column has both variants of are left out.

Usage:  python benchmarks/claims.py BENCH_DIR/results.json [MORE/results.json ...]   (a Markdown table)
        python benchmarks/claims.py --column "llama-tiny, stdlib" A/results.json --column "llama-10m, stdlib" B/results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

# (claim, AdLoCo variant, other variant, figure, where the claim wants the ratio: "<1" or ">1")
CLAIMS: list[tuple[str, str, str, str, str]] = [
    ("lower final perplexity than DiLoCo", "adloco", "diloco", "final", "<1"),
    ("reaches the target in fewer examples than DiLoCo", "adloco", "diloco", "to_target.examples", "<1"),
    ("reaches the target sooner than DiLoCo (simulated time)", "adloco", "diloco", "to_target.sim_s", "<1"),
    ("communicates less than DiLoCo to the target", "adloco", "diloco", "to_target.bytes", "<1"),
    ("communicates less than DiLoCo in the whole run", "adloco", "diloco", "bytes", "<1"),
    (
        "adaptive batches help: lower final perplexity than without",
        "adloco",
        "adloco-no-adaptive",
        "final",
        "<1",
    ),
    ("adaptive batches cut the bytes to the target", "adloco", "adloco-no-adaptive", "to_target.bytes", "<1"),
    ("merging helps: lower final perplexity than without", "adloco", "adloco-no-merge", "final", "<1"),
    ("switch mode helps: lower final perplexity than capping", "adloco", "adloco-no-switch", "final", "<1"),
    (
        "switch mode reaches the target sooner (simulated time)",
        "adloco",
        "adloco-no-switch",
        "to_target.sim_s",
        "<1",
    ),
    ("lower final perplexity than DiLoCo with a batch schedule", "adloco", "diloco-schedule", "final", "<1"),
    (
        "reaches the target sooner than DiLoCo with a batch schedule (simulated time)",
        "adloco",
        "diloco-schedule",
        "to_target.sim_s",
        "<1",
    ),
    (
        "communicates less than DiLoCo with a batch schedule to the target",
        "adloco",
        "diloco-schedule",
        "to_target.bytes",
        "<1",
    ),
]


def figure(run: dict[str, Any], key: str) -> float | None:
    x: Any = run
    for part in key.split("."):
        if not isinstance(x, dict) or x.get(part) is None:
            return None
        x = x[part]
    return float(x)


def ratios(results: dict[str, Any], a: str, b: str, key: str) -> list[float] | None:
    """The per-seed ratios a/b of ``key``, or None when either variant lacks it on a seed they share."""
    va, vb = results["variants"].get(a), results["variants"].get(b)
    if va is None or vb is None:
        return None
    by_seed = {r["seed"]: r for r in vb["runs"] if r.get("final") is not None}
    out = []
    for r in va["runs"]:
        other = by_seed.get(r.get("seed"))
        if r.get("final") is None:  # a failed run is in the report's failures, not in a ratio
            continue
        if other is None:
            continue
        x, y = figure(r, key), figure(other, key)
        if x is None or y is None or y == 0:
            return None
        out.append(x / y)
    return out or None


def verdict(rs: list[float] | None, side: str) -> str:
    if rs is None:
        return "not shown"
    if all(r == 1 for r in rs):
        return "no difference"  # the two variants ran alike, e.g. an ablation of something never used
    good = [(r < 1) if side == "<1" else (r > 1) for r in rs]
    return "confirmed" if all(good) else "refuted" if not any(good) else "mixed"


def table(results: dict[str, Any]) -> str:
    target = results.get("target")
    lines = [
        f"Target: validation perplexity {target:.1f}. Ratios are AdLoCo's figure over the other's, per seed.",
        "",
        "| claim | ratio, mean [min–max] | seeds | verdict |",
        "|---|---|---|---|",
    ]
    for claim, a, b, key, side in CLAIMS:
        rs = ratios(results, a, b, key)
        lines.append(f"| {claim} | {shown(rs)} | {0 if rs is None else len(rs)} | {verdict(rs, side)} |")
    return "\n".join(lines)


def shown(rs: list[float] | None) -> str:
    return "—" if rs is None else f"{statistics.fmean(rs):.2f} [{min(rs):.2f}–{max(rs):.2f}]"


def columns(benches: list[tuple[str, dict[str, Any]]]) -> str:
    """One table, a column per (label, results): each cell the ratio's mean [min–max] and its verdict.
    The header gives each column's target and seeds; a claim no column has both variants of is left out."""
    head = []
    for label, results in benches:
        n = max((len(v.get("runs", [])) for v in results["variants"].values()), default=0)
        head.append(f"{label}, {n} seed{'s' if n != 1 else ''}, target {results.get('target') or 0:.0f}")
    lines = [
        "| claim | " + " | ".join(head) + " |",
        "|---|" + "---|" * len(head),
    ]
    for claim, a, b, key, side in CLAIMS:
        if not any(a in r["variants"] and b in r["variants"] for _, r in benches):
            continue
        cells = []
        for _, results in benches:
            rs = ratios(results, a, b, key)
            cells.append("—" if rs is None else f"{shown(rs)} {verdict(rs, side)}")
        lines.append(f"| {claim} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def merged(all_results: list[dict[str, Any]]) -> dict[str, Any]:
    """One results dict from several benches priced alike (see the module's doc)."""
    first = all_results[0]
    out = {**first, "variants": dict(first["variants"])}

    def pricing(r: dict[str, Any]) -> tuple[Any, ...]:
        return r.get("target"), r.get("network"), (r.get("compute") or {}).get("seconds_per_example")

    for other in all_results[1:]:
        if pricing(other) != pricing(first):
            raise SystemExit(
                f"claims: the benches are priced differently (target, network, seconds per example: "
                f"{pricing(first)} and {pricing(other)}); rewrite one with adloco bench --report-only "
                "--target/--seconds-per-example"
            )
        if "adloco" in other["variants"]:
            out["variants"] = {k: v for k, v in out["variants"].items() if not k.startswith("adloco-")}
        out["variants"].update(other["variants"])
    return out


def read(files: list[Path]) -> dict[str, Any]:
    out = []
    for f in files:
        try:
            out.append(json.loads(f.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise SystemExit(f"claims: {f}: not a readable results.json of adloco bench ({exc})") from None
    return merged(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="*", help="results.json of finished adloco benches")
    ap.add_argument(
        "--column",
        nargs=2,
        action="append",
        default=[],
        metavar=("LABEL", "FILES"),
        help="a column: its label and its results.json (several joined by commas); repeatable",
    )
    args = ap.parse_args()
    if bool(args.results) == bool(args.column):
        ap.error("give results.json files (one column) or --column LABEL FILES (one per column), not both")
    if args.column:
        benches = [(label, read([Path(x) for x in files.split(",")])) for label, files in args.column]
        print(columns(benches))
    else:
        print(table(read(args.results)))


if __name__ == "__main__":
    main()
