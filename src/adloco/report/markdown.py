"""The markdown report of one or several runs (``adloco report``, the end of ``adloco train``), and the
tables a bench's report (:mod:`adloco.bench.writer`, ``adloco bench``) is made of: the per-run table,
the sentences on the target and simulated time, and figures over seeds as table cells (mean, min–max,
95% t-interval). Tables from :mod:`adloco.report.results`, plots from :mod:`adloco.report.plots`. Never
inside the training loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from adloco.errors import UserError
from adloco.report.plots import default_target, draw
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


def _what(runs: Sequence[Run]) -> str:
    return "perplexity" if runs[0].metric == "val_ppl" else "accuracy"


def _sim_sentence(runs: Sequence[Run]) -> str:
    return (
        f"Simulated time: {compute_sentence(runs)} plus every counted collective on {network_text(runs)} "
        "(ring all-reduce 2(n−1)/n·B/bandwidth + 2(n−1)·latency; disjoint trainers' collectives side by "
        "side; ALGORITHM.md §7)."
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
    # one run: no target line on its plots where the target is its own final value (draw drops it)
    drawn = draw(runs, out / "plots", target)
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


# -- figures over seeds, as table cells ---------------------------------------------------------------


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
