"""What every plot of :mod:`adloco.report.plots` and :mod:`adloco.report.trainer_plots` is drawn with:
one colour per trainer id, counts on integer ticks, the legend beside the axes, the line marking a
change of workers, and one run or a variant's seeds as their mean curve with a min–max band."""

from __future__ import annotations

from typing import Any

from adloco import events
from adloco.report.results import interpolate, mean_curve

# One colour per trainer id in every per-run plot (matplotlib's tab10): trainer 2 is the same green in
# the request, allocation and idle-share plots.
TRAINER_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def trainer_colour(t: int) -> str:
    return TRAINER_COLOURS[t % len(TRAINER_COLOURS)]


def membership_text(m: events.Membership) -> str:
    if m.workers != m.workers_before:
        return f"{m.workers_before} → {m.workers} workers"
    return f"restart ({m.workers} workers)"


def _count(v: float, _pos: Any = None) -> str:
    """A count on a tick: 1,500; 250k; 1.2M."""
    if abs(v) >= 1e6:
        return f"{v / 1e6:g}M"
    if abs(v) >= 1e5:
        return f"{v / 1e3:g}k"
    return f"{v:,.0f}" if v == int(v) else f"{v:g}"


def _integer_axis(axis: Any) -> None:
    """Integer ticks for a count (never ticked in halves), written as counts."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    axis.set_major_formatter(FuncFormatter(_count))


def _outside_legend(ax: Any, **kw: Any) -> None:
    """The legend to the right of the axes (constrained layout makes room for it)."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=7, **kw)


def _membership_line(ax: Any, m: events.Membership, colour: str, label: str | None) -> None:
    """A vertical line between the round a change of workers followed and the first round after it,
    with its text (e.g. "4 → 2 workers") along it."""
    x = m.round + 0.5
    ax.axvline(x, color=colour, linestyle="-.", linewidth=1.2, label=label)
    ax.annotate(
        membership_text(m),
        (x, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(3, -4),
        textcoords="offset points",
        rotation=90,
        ha="left",
        va="top",
        fontsize=7,
        color=colour,
        bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
    )


def _draw_group(ax: Any, label: str, curves: list[list[tuple[float, float]]], small: bool = False) -> str:
    """One run, or a variant's seeds as their mean with a min–max band (each seed's part beyond the
    shortest one a thin dashed line); returns its colour."""
    from matplotlib.colors import to_hex

    size = 1.5 if small else 3.0
    if len(curves) == 1:
        (line,) = ax.plot(*zip(*curves[0], strict=True), marker="o", markersize=size, label=label)
        return to_hex(line.get_color())
    xs, mean, lo, hi = mean_curve(curves)
    (line,) = ax.plot(xs, mean, marker="o", markersize=size * 0.7, label=f"{label} ({len(curves)} seeds)")
    ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    for c in curves:  # beyond the common range: each seed alone, never averaged
        tail = [(x, y) for x, y in c if xs and x > xs[-1]]
        (joint,) = interpolate(c, xs[-1:]) if xs else (None,)
        if tail and joint is not None:
            ax.plot(
                *zip((xs[-1], joint), *tail, strict=True),
                color=line.get_color(),
                linestyle="--",
                linewidth=0.8,
                alpha=0.6,
            )
    return to_hex(line.get_color())
