"""The markdown report of one or several runs (``adloco report``, the end of ``adloco train``) and of a
bench's variants over seeds (``adloco bench``): tables from :mod:`adloco.report.results`, plots from
:mod:`adloco.report.plots`. Never inside the training loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adloco import events
from adloco.errors import UserError
from adloco.report.plots import draw
from adloco.report.results import (
    Run,
    Stats,
    compute_sentence,
    network_text,
    reach,
    stats,
    switch_threshold,
    theorem1,
)
from adloco.telemetry.progress import fmt_bytes

# -- the report -------------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def default_target(runs: Sequence[Run]) -> float:
    """The worst final metric among the runs (every run reaches it): the highest perplexity, or the
    lowest accuracy; a run whose final evaluation was not finite does not count."""
    finals = [r.final for r in runs if math.isfinite(r.final)] or [r.end.value for r in runs if r.end]
    return max(finals) if runs[0].metric == "val_ppl" else min(finals)


def _what(runs: Sequence[Run]) -> str:
    return "perplexity" if runs[0].metric == "val_ppl" else "accuracy"


def _sim_sentence(runs: Sequence[Run]) -> str:
    return (
        f"Simulated time: {compute_sentence(runs)} plus every counted collective on {network_text(runs)} "
        "(ring all-reduce 2(n−1)/n·B/bandwidth + 2(n−1)·latency; ALGORITHM.md §7)."
    )


def _value(x: float, metric: str = "val_ppl") -> str:
    if math.isnan(x):
        return "—"
    return "inf" if math.isinf(x) else f"{x:.2f}"


def _table(runs: Sequence[Run], target: float) -> list[str]:
    """One row per run: its final metric, what it took to reach the target, and its totals."""
    what = _what(runs)
    lines = [
        f"| run | method | rounds | final {what} | examples → target | comms → target | bytes → target "
        "| sim. time → target | examples | bytes | sim. time | peak memory | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        got = reach(r, target)
        s = r.summary
        last = r.end
        assert last is not None
        lines.append(
            f"| {r.label} | {r.method} | {last.round} | {_value(r.final)} | "
            + (
                f"{got.examples:,} | {got.communications:,} | {fmt_bytes(got.bytes)} | {got.sim_s:.1f} s"
                if got
                else "not reached | — | — | —"
            )
            + f" | {last.examples:,} | {fmt_bytes(last.bytes)} | {last.sim_s:.1f} s | "
            + f"{fmt_bytes(s['peak_memory_bytes']) if s.get('peak_memory_bytes') else '—'} | "
            + f"{_fmt(s.get('wall_s'))} s |"
        )
    return lines


def _theorem1_note(runs: Sequence[Run]) -> list[str]:
    """What the request plots' marks are, for a report."""
    text = []
    if any(theorem1(r) for r in runs):
        text.append(
            "The × marks on the request plots are the Theorem 1 lower bound (ALGORITHM.md §8) on a trainer's "
            "request (in its colour), computed from the previous round's logged estimates of σ² and "
            "‖ḡ‖²: a reconstructed statement with unverified constants, drawn as a sanity check of the "
            "batch trajectories, not as the paper's numbers."
        )
    if any(switch_threshold(r) for r in runs):
        text.append(
            "Their dashed line is κ·b_max (κ: config switch.kappa; b_max: the micro-batch of the workers "
            "that reached it, else config switch.b_max): in switch mode threshold a worker whose request "
            "passes it accumulates micro-batches of b_max."
        )
    return [" ".join(text), ""] if text else []


def write(runs: list[Run], out: Path, target: float | None = None, command: str | None = None) -> Path:
    """Draw the plots into ``out/plots`` and write ``out/report.md``; returns the report."""
    if any(r.metric != "val_ppl" for r in runs) and len(runs) > 1:
        raise UserError("report: comparing runs needs language-model runs (validation perplexity)")
    out.mkdir(parents=True, exist_ok=True)
    if target is None:
        target = default_target(runs)
    one = len(runs) == 1
    # one run: no target line on its plots (its own final value would be one), and a title that says so
    drawn = draw(runs, out / "plots", target if not one or target != default_target(runs) else None)
    lines = [
        f"# adloco report: one run, {runs[0].path.name}"
        if one
        else f"# adloco comparison of {len(runs)} runs",
        "",
    ]
    if command:
        lines += ["Made by:", "", "```bash", command, "```", ""]
    what = _what(runs)
    lines += [
        f"Target {what}: **{target:.2f}** (the worst final {what} among the runs unless given). "
        f"Validation {what} is trainer 0's (the lowest id alive: every merge keeps it), never the best of "
        f"several trainers on the split it reports. {_sim_sentence(runs)} "
        "Peak memory: the process's resident set on CPU, CUDA allocations on a GPU.",
        "",
        *_table(runs, target),
    ]
    lines += ["", "Plots:", ""] + [f"![{n}](plots/{n})" for n in drawn] + [""]
    lines += _theorem1_note(runs)
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report


# -- a bench: variants over seeds, the grid, the failures ----------------------------------------------


def figures(run: Run, target: float) -> dict[str, Any]:
    """A run's figures for ``results.json``: final metric, totals and what reaching the target took."""
    end = run.end
    assert end is not None
    got = reach(run, target)
    return {
        "run": run.label,
        "seed": run.seed,
        "final": events.num(run.final),
        "rounds": end.round,
        "examples": end.examples,
        "communications": end.communications,
        "bytes": end.bytes,
        "sim_s": end.sim_s,
        "to_target": None
        if got is None
        else {
            "round": got.round,
            "examples": got.examples,
            "communications": got.communications,
            "bytes": got.bytes,
            "sim_s": got.sim_s,
        },
        "wall_s": run.summary.get("wall_s"),
        "peak_memory_bytes": run.summary.get("peak_memory_bytes"),
    }


# (key in results.json, column, format): the figures of the bench table, each over the seeds
FIGURES: list[tuple[str, str, str]] = [
    ("final", "final {what}", "value"),
    ("examples_to_target", "examples → target", "count"),
    ("communications_to_target", "comms → target", "count"),
    ("bytes_to_target", "bytes → target", "bytes"),
    ("sim_s_to_target", "sim. time → target", "seconds"),
    ("bytes", "bytes", "bytes"),
    ("sim_s", "sim. time", "seconds"),
]


def aggregate(runs: Sequence[Run], target: float) -> dict[str, Stats | None]:
    """Each figure of :data:`FIGURES` over the runs (seeds); to-target figures over those that reached
    the target."""
    got = [g for g in (reach(r, target) for r in runs) if g is not None]
    ends = [r.end for r in runs if r.end is not None]
    return {
        "final": stats([r.final for r in runs]),
        "examples_to_target": stats([g.examples for g in got]),
        "communications_to_target": stats([g.communications for g in got]),
        "bytes_to_target": stats([g.bytes for g in got]),
        "sim_s_to_target": stats([g.sim_s for g in got]),
        "bytes": stats([e.bytes for e in ends]),
        "sim_s": stats([e.sim_s for e in ends]),
    }


def _one(x: float, kind: str) -> str:
    if not math.isfinite(x):
        return "inf" if x > 0 else "—"
    if kind == "value":
        return f"{x:.2f}"
    if kind == "count":
        return f"{x:,.0f}"
    if kind == "bytes":
        return fmt_bytes(x)
    return f"{x:.1f} s" if abs(x) >= 1 or x == 0 else f"{x:.2g} s"


def cell(st: Stats | None, kind: str, of: int | None = None) -> str:
    """``mean [min–max] ±h`` (h: the 95% t-interval's half-width, from 3 seeds); one value alone;
    ``(k/n reached)`` when only k of the n seeds count (to-target figures)."""
    if st is None:
        return f"not reached (0/{of})" if of else "—"
    text = _one(st.mean, kind)
    if st.n > 1:
        lo, hi = _one(st.min, kind), _one(st.max, kind)
        if kind == "seconds":
            lo = lo.removesuffix(" s")
        text += f" [{lo}–{hi}]"
    if st.half is not None:
        text += f" ±{_one(st.half, kind)}"
    if of is not None and st.n < of:
        text += f" ({st.n}/{of} reached)"
    return text


@dataclass
class Variant:
    """A compared variant: its finished runs (one per seed) at its one setting."""

    name: str
    method: str
    setting: str  # the setting in words ("preset"; "outer.lr=0.5, outer.momentum=0.9 (#1 of 6)")
    runs: list[Run]
    seeds: list[int]  # the seeds it was to run on


@dataclass
class GridRow:
    """One setting of a method's grid, on the first seed."""

    method: str
    index: int
    setting: str
    run: Run | None  # None: it failed
    status: str  # "ok" or why not
    selected: bool


@dataclass
class Failed:
    """A run that failed (or was never started because what it needed failed)."""

    variant: str
    seed: int
    status: str  # failed | skipped
    exit_code: int | None
    folder: str | None  # where its bench-failure.txt is, relative to the bench folder
    lines: list[str]  # the last lines of its stderr, or why it was skipped


def write_bench(
    variants: list[Variant],
    out: Path,
    target: float,
    *,
    intro: list[str],
    grids: dict[str, list[GridRow]] | None = None,
    failed: list[Failed] | None = None,
    command: str | None = None,
    first_seed: int = 0,
) -> Path:
    """``out/report.md`` and ``out/plots`` of a bench: the variants' figures over seeds (mean, min–max,
    95% t-interval), mean curves with min–max bands, failed runs, the grid and every run."""
    out.mkdir(parents=True, exist_ok=True)
    runs = [r for v in variants for r in v.runs]
    lines = ["# adloco bench", ""]
    if command:
        lines += ["Made by:", "", "```bash", command, "```", ""]
    lines += intro
    if runs:
        what = _what(runs)
        several = any(len(v.runs) > 1 for v in variants)
        lines += [
            f"Target {what}: **{target:.2f}**. Validation {what} is trainer 0's at each evaluation. "
            + _sim_sentence(runs),
            "",
        ]
        if several:
            lines += [
                "Each cell: the mean over the seeds [min–max] ±h, h the half-width of the 95% Student-t "
                "interval of the mean (t_{0.975, n−1} · s/√n, s the standard deviation over the n seeds; "
                "from 3 seeds on). To-target figures are over the seeds that reached the target.",
                "",
            ]
        head = [c.format(what=what) for _, c, _ in FIGURES]
        lines += [
            "| variant | method | setting | seeds | " + " | ".join(head) + " |",
            "|---|---|---|---|" + "---|" * len(head),
        ]
        for v in variants:
            seeds = f"{len(v.runs)}" if len(v.runs) == len(v.seeds) else f"{len(v.runs)} of {len(v.seeds)}"
            if not v.runs:
                lines.append(
                    f"| {v.name} | {v.method} | {v.setting} | 0 of {len(v.seeds)} |" + " — |" * len(head)
                )
                continue
            agg = aggregate(v.runs, target)
            cells = [
                cell(agg[key], kind, len(v.runs) if key.endswith("_to_target") else None)
                for key, _, kind in FIGURES
            ]
            lines.append(f"| {v.name} | {v.method} | {v.setting} | {seeds} | " + " | ".join(cells) + " |")
        drawn = draw(runs, out / "plots", target, groups=[(v.name, v.runs) for v in variants if v.runs])
        lines += ["", "Plots:", ""] + [f"![{n}](plots/{n})" for n in drawn] + [""]
        if several:
            lines += [
                "A variant of several seeds is drawn as its mean curve with a min–max band. Seeds of one "
                "budget can end at different rounds, examples, bytes or times, so each seed's curve is "
                "interpolated linearly onto a common x grid (the union of the seeds' x values) and averaged "
                "only where every seed has data: up to the shortest seed's last point, never extrapolated. "
                "Beyond it each seed's own curve goes on as a thin dashed line. The per-run plots (requests, "
                "trainers, allocation, batch) show each variant's first seed.",
                "",
            ]
        lines += _theorem1_note(runs)
    else:
        lines += ["No run finished: nothing to compare.", ""]
    if failed:
        lines += [
            "## Runs that failed",
            "",
            "Left out of every figure above. Each folder holds `bench-failure.txt` (the exit code and the "
            "last lines of its stderr); the whole output is in `logs/`.",
            "",
            "| variant | seed | status | exit code | folder | last line of stderr |",
            "|---|---|---|---|---|---|",
        ]
        for f in failed:
            last = next((x for x in reversed(f.lines) if x.strip()), "")
            last = last.strip().replace("|", "\\|")
            code = "—" if f.exit_code is None else str(f.exit_code)
            folder = f"`{f.folder}`" if f.folder else "—"
            lines.append(f"| {f.variant} | {f.seed} | {f.status} | {code} | {folder} | {last} |")
        lines.append("")
    for method, rows in (grids or {}).items():
        grid_runs = [row.run for row in rows if row.run is not None]
        what = _what(grid_runs) if grid_runs else "perplexity"
        lines += [
            f"## Grid of {method} (seed {first_seed})",
            "",
            f"| # | setting | final {what} | bytes → target | bytes | sim. time → target | sim. time | |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            mark = "**selected**" if row.selected else ("" if row.status == "ok" else row.status)
            if row.run is None or row.run.end is None:
                lines.append(f"| {row.index} | {row.setting} | — | — | — | — | — | {mark} |")
                continue
            got = reach(row.run, target)
            end = row.run.end
            lines.append(
                f"| {row.index} | {row.setting} | {_value(row.run.final)} | "
                f"{fmt_bytes(got.bytes) if got else 'not reached'} | {fmt_bytes(end.bytes)} | "
                f"{_one(got.sim_s, 'seconds') if got else 'not reached'} | {_one(end.sim_s, 'seconds')} | {mark} |"
            )
        lines.append("")
    if runs:
        lines += ["## Every run", "", *_table(runs, target), ""]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report
