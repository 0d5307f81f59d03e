"""Every plot, from run directories alone: one run (drawn at the end of ``adloco train``), several
(``adloco report``), or a bench's variants over several seeds (``adloco bench``). Never inside the
training loop.

Each plot is drawn once, by one function, whatever the number of runs; a variant run on several seeds
is drawn as its mean curve with a min–max band (:func:`adloco.report.results.mean_curve`).

The curve plots (validation against rounds, examples, communications, bytes and simulated time) are
here, with :func:`make_figures`, :func:`draw` and :func:`plot_run`; the per-run plots of the trainers
are in :mod:`adloco.report.trainer_plots`, what both are drawn with in :mod:`adloco.report.plot_parts`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adloco.report.plot_parts import (
    _count,
    _draw_group,
    _integer_axis,
    _membership_line,
    _outside_legend,
    membership_text,
)
from adloco.report.results import Run, interpolate, load, memberships, network_text
from adloco.report.trainer_plots import (
    allocation_figure,
    batch_figure,
    idle_share_figure,
    lr_figure,
    lr_moved,
    requests_figure,
    trainers_alive_figure,
)

# -- plots ------------------------------------------------------------------------------------------
#
# Each plot is one function that returns a matplotlib Figure, built without pyplot (nothing global is
# touched, nothing needs closing): :func:`make_figures` builds them all, :func:`draw` saves them. A
# curve plot draws every run on one axes; a per-run plot (requests, allocation, batch) has one panel
# per run (a bench's variant: its first seed).

# A curve reaching this many times further along x than every other is clipped (the axis ends a little
# after the next longest), and every curve is drawn whole again in an inset.
CLIP = 2.5

# x of a curve plot: Point attribute -> (file name part, axis label)
CURVES: dict[str, tuple[str, str]] = {
    "round": ("round", "round"),
    "examples": ("examples", "training examples processed"),
    "communications": ("communications", "communications (collective operations counted)"),
    "bytes": ("bytes", "bytes communicated, all workers"),
    "sim_s": ("simulated_time", "simulated time"),
}
BYTE_UNITS = ((1.0, "B"), (1e3, "KB"), (1e6, "MB"), (1e9, "GB"), (1e12, "TB"))
TIME_UNITS = ((1.0, "s"), (60.0, "min"), (3600.0, "h"))


def _unit(top: float, units: Sequence[tuple[float, str]], at_least: float = 1.0) -> tuple[float, str]:
    """The largest of ``units`` in which ``top`` is at least ``at_least``."""
    scale, name = units[0]
    for s, n in units:
        if top >= at_least * s:
            scale, name = s, n
    return scale, name


def _plain_log(axis: Any, lo: float, hi: float) -> None:
    """A log axis labelled with plain numbers (300, not 3×10²): within a decade, evenly spaced round
    ticks (150, 200, 250, 300); over a few decades, the 2s and 5s of each labelled too."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullLocator

    decades = math.log10(hi / lo) if 0 < lo < hi else 1.0
    plain = FuncFormatter(lambda v, _pos=None: f"{v:g}")
    if decades < 1:
        axis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
        axis.set_minor_locator(NullLocator())
        axis.set_major_formatter(plain)
        return
    subs = (2.0, 5.0) if decades < 3 else ()

    def minor(v: float, _pos: Any = None) -> str:
        if v <= 0:
            return ""
        lead = round(v / 10 ** math.floor(math.log10(v)), 6)
        return f"{v:g}" if lead in subs else ""

    axis.set_major_formatter(plain)
    axis.set_minor_formatter(FuncFormatter(minor))


def _label_ends(ax: Any, curves: Sequence[Sequence[tuple[float, float]]]) -> None:
    """The first and last value of each curve written on the y axis (a log axis labels only its round
    numbers): with the other labels, minus those too close to one of them to read."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ends = sorted({p[1] for c in curves if c for p in (c[0], c[-1]) if p[1] > 0})
    if not ends or len(ends) > 6:
        return
    lo, hi = ax.get_ylim()
    span = math.log10(hi / lo) if 0 < lo < hi else 1.0
    near = 0.06 * span  # in decades: closer than this to an end value, a label would overlap it
    shown = [
        t
        for t in [*ax.yaxis.get_majorticklocs(), *ax.yaxis.get_minorticklocs()]
        if lo <= t <= hi and ax.yaxis.get_minor_formatter()(t) + ax.yaxis.get_major_formatter()(t)
    ]
    keep = [t for t in shown if all(abs(math.log10(t / e)) > near for e in ends)]
    ax.yaxis.set_major_locator(FixedLocator(sorted({*keep, *ends})))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos=None: f"{v:,.0f}" if v >= 100 else f"{v:.3g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(lo, hi)


def _compute_words(runs: Sequence[Run]) -> str:
    r = runs[0]
    if r.compute == "examples" and r.seconds_per_example is not None:
        return f"priced as examples × {r.seconds_per_example * 1e3:.3g} ms"
    return "measured"


def _curves_of(attr: str, members: Sequence[Run]) -> list[list[tuple[float, float]]]:
    return [[(float(getattr(p, attr)), p.value) for p in r.points] for r in members]


def curve_figure(groups: Sequence[tuple[str, Sequence[Run]]], attr: str, target: float | None = None) -> Any:
    """Trainer 0's validation metric of every run against ``attr`` (a key of :data:`CURVES`), from the
    true origin (0 examples, communications, bytes, seconds) on linear x. A run reaching more than
    :data:`CLIP` times further than every other is clipped at the edge (its end written there) and
    every curve drawn whole in an inset."""
    from matplotlib.figure import Figure

    runs = [r for _, members in groups for r in members]
    acc = runs[0].metric == "val_accuracy"
    what = "accuracy" if acc else "perplexity"
    xlabel = CURVES[attr][1]
    per_group = [_curves_of(attr, members) for _, members in groups]
    extents = sorted((max((x for c in cs for x, _ in c), default=0.0) for cs in per_group), reverse=True)
    clip = attr != "round" and len(extents) > 1 and extents[1] > 0 and extents[0] > CLIP * extents[1]
    right = 1.1 * extents[1] if clip else (extents[0] if extents else 0.0)
    scale, unit = 1.0, ""
    if attr == "bytes":
        scale, unit = _unit(right, BYTE_UNITS)
    elif attr == "sim_s":
        scale, unit = _unit(right, TIME_UNITS, at_least=5.0)
    if unit:
        xlabel = f"{xlabel} ({unit})"
    scaled = [[[(x / scale, y) for x, y in c] for c in cs] for cs in per_group]

    fig = Figure(figsize=(9.6 if clip else 8.6, 4.6), layout="constrained")
    if clip:  # the legend above, the whole range below, right of the plot: neither covers a curve
        grid = fig.add_gridspec(2, 2, width_ratios=(3.0, 1.0), height_ratios=(1.0, 1.0))
        ax = fig.add_subplot(grid[:, 0])
        side = fig.add_subplot(grid[0, 1])
        side.axis("off")
        whole = fig.add_subplot(grid[1, 1])
    else:
        ax = fig.add_subplot()
    colours = [_draw_group(ax, label, cs) for (label, _), cs in zip(groups, scaled, strict=True)]
    if target is not None:
        ax.axhline(target, color="grey", linestyle=":", linewidth=1, label=f"target {target:.1f}")
    starts = {round(r.points[0].value, 9) for r in runs if r.points}
    if len(starts) == 1 and len(runs) > 1:
        v = runs[0].points[0].value
        ax.annotate(
            f"start: {v:.4g} (every run)",
            (0, v),
            xytext=(6, 3),
            textcoords="offset points",
            fontsize=7,
            color="dimgrey",
        )
    if attr == "round":
        for (label, members), colour in zip(groups, colours, strict=True):
            for m in memberships(members[0]):
                who = (
                    ""
                    if len(groups) == 1
                    else f"{label}: "
                    if len(members) == 1
                    else f"{label} (seed {members[0].seed}): "
                )
                own = "black" if len(groups) == 1 else colour
                _membership_line(ax, m, own, f"{who}{membership_text(m)} after round {m.round}")
    ax.set(xlabel=xlabel, ylabel=f"validation {what} (trainer 0)")
    if not acc:
        ax.set_yscale("log")
        _plain_log(ax.yaxis, *ax.get_ylim())
        _label_ends(ax, [c for cs in scaled for c in cs])
    if attr in ("round", "communications", "examples"):
        _integer_axis(ax.xaxis)
    ax.set_xlim(left=0)
    if clip:
        ax.set_xlim(0, right / scale)
        _whole_range(whole, ax, groups, scaled, colours, right / scale, acc, unit or attr)
    ax.grid(alpha=0.3)
    if clip:
        side.legend(*ax.get_legend_handles_labels(), loc="upper left", fontsize=7)
    else:
        _outside_legend(ax)
    title = f"Validation {what} of trainer 0 (the lowest id alive: every merge keeps it)"
    if attr == "sim_s":
        title += f"\nsimulated on {network_text(runs)}; compute {_compute_words(runs)}"
    ax.set_title(title, fontsize=10)
    return fig


def _whole_range(
    whole: Any,
    ax: Any,
    groups: Sequence[tuple[str, Sequence[Run]]],
    scaled: list[list[list[tuple[float, float]]]],
    colours: list[str],
    right: float,
    acc: bool,
    unit: str,
) -> None:
    """Every curve whole on the small axes ``whole`` (the range of the clipped plot ``ax`` shaded);
    where a curve leaves ``ax``, where it goes on to is written at the edge."""
    top = 0.0
    for cs, colour in zip(scaled, colours, strict=True):
        for c in cs:
            whole.plot(*zip(*c, strict=True), color=colour, linewidth=1)
            top = max(top, c[-1][0])
    whole.axvspan(0, right, color="grey", alpha=0.2, linewidth=0)
    whole.set_xlim(0, top * 1.03)
    if not acc:
        whole.set_yscale("log")
        _plain_log(whole.yaxis, *whole.get_ylim())
    if unit in ("examples", "communications"):
        _integer_axis(whole.xaxis)
    whole.tick_params(labelsize=6, which="both")
    whole.set_title("whole range (shaded: the plot's)", fontsize=7)
    whole.set_xlabel(unit, fontsize=7)
    whole.grid(alpha=0.3)
    for (label, _), cs, colour in zip(groups, scaled, colours, strict=True):
        end = max(cs, key=lambda c: c[-1][0])
        if end[-1][0] <= right:
            continue
        (y,) = interpolate(end, [right])
        if y is None:
            continue
        x_end, v_end = end[-1]
        reach = _count(x_end) if unit in ("examples", "communications") else f"{x_end:.3g}"
        ax.annotate(
            f"{label} continues to {reach} {unit} (final {v_end:.4g}) →",
            (right, y),
            xytext=(-4, -6),
            textcoords="offset points",
            ha="right",
            va="top",
            fontsize=7,
            color=colour,
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
        )


def default_target(runs: Sequence[Run]) -> float:
    """The worst final metric among the runs (every run reaches it): the highest perplexity, or the
    lowest accuracy; a run whose final evaluation was not finite does not count."""
    finals = [r.final for r in runs if math.isfinite(r.final)] or [r.end.value for r in runs if r.end]
    return max(finals) if runs[0].metric == "val_ppl" else min(finals)


def make_figures(
    runs: list[Run],
    target: float | None = None,
    groups: list[tuple[str, list[Run]]] | None = None,
) -> dict[str, Any]:
    """Every plot, by file name, as matplotlib Figures (see :func:`draw`).

    ``target`` is drawn as a dotted line on the curve plots of a comparison; a single run (or a single
    variant's seeds) draws none where the target is its own final value (the default a report takes),
    which would mark where the run ended, not a target it was given."""
    if groups is None:
        groups = [(r.label, [r]) for r in runs]
    groups = [(label, members) for label, members in groups if members]
    if target is not None and len(groups) == 1 and target == default_target(groups[0][1]):
        target = None
    short = "val_accuracy" if groups[0][1][0].metric == "val_accuracy" else "val_ppl"
    out: dict[str, Any] = {}
    for attr, (name, _) in CURVES.items():
        out[f"{short}_vs_{name}.png"] = curve_figure(groups, attr, target)
    firsts = [(label, members[0], len(members)) for label, members in groups]
    out["requests.png"] = requests_figure(firsts)
    if lr_moved(firsts):
        out["lr.png"] = lr_figure(firsts)
    out["trainers_alive.png"] = trainers_alive_figure(firsts)
    out["allocation.png"] = allocation_figure(firsts)
    out["batch.png"] = batch_figure(firsts)
    out["idle_share.png"] = idle_share_figure(groups)
    return out


def draw(
    runs: list[Run],
    plots: Path,
    target: float | None = None,
    groups: list[tuple[str, list[Run]]] | None = None,
) -> list[str]:
    """Every plot, each drawn once, into ``plots``; returns the file names.

    ``groups`` (label, runs of several seeds): each group's curves are drawn as their mean with a
    min–max band (:func:`mean_curve`), each seed's part beyond the shortest one as a thin dashed line;
    the per-run plots show each group's first run. Without ``groups`` every run is its own."""
    plots.mkdir(parents=True, exist_ok=True)
    drawn = []
    for name, fig in make_figures(runs, target, groups).items():
        fig.savefig(plots / name, dpi=110)
        drawn.append(name)
    return drawn


def plot_run(run_dir: Path) -> list[Path]:
    """A finished run's plots into ``run_dir/plots``; returns their paths."""
    run = load(run_dir)
    return [run_dir / "plots" / n for n in draw([run], run_dir / "plots")]
