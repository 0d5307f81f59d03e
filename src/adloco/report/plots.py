"""Every plot, from run directories alone: one run (drawn at the end of ``adloco train``), several
(``adloco report``), or a bench's variants over several seeds (``adloco bench``). Never inside the
training loop.

Each plot is drawn once, by one function, whatever the number of runs; a variant run on several seeds
is drawn as its mean curve with a min–max band (:func:`adloco.report.results.mean_curve`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adloco import events
from adloco.report.results import (
    Run,
    interpolate,
    load,
    mean_curve,
    memberships,
    network_text,
    switch_threshold,
    theorem1,
)

# -- plots ------------------------------------------------------------------------------------------
#
# Each plot is one function that returns a matplotlib Figure, built without pyplot (nothing global is
# touched, nothing needs closing): :func:`make_figures` builds them all, :func:`draw` saves them. A
# curve plot draws every run on one axes; a per-run plot (requests, allocation, batch) has one panel
# per run (a bench's variant: its first seed).

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


def trainer_colour(t: int) -> str:
    return TRAINER_COLOURS[t % len(TRAINER_COLOURS)]


def membership_text(m: events.Membership) -> str:
    if m.workers != m.workers_before:
        return f"{m.workers_before} → {m.workers} workers"
    return f"restart ({m.workers} workers)"


def _unit(top: float, units: Sequence[tuple[float, str]], at_least: float = 1.0) -> tuple[float, str]:
    """The largest of ``units`` in which ``top`` is at least ``at_least``."""
    scale, name = units[0]
    for s, n in units:
        if top >= at_least * s:
            scale, name = s, n
    return scale, name


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


def _outside_legend(ax: Any, **kw: Any) -> None:
    """The legend to the right of the axes (constrained layout makes room for it)."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=7, **kw)


def _compute_words(runs: Sequence[Run]) -> str:
    r = runs[0]
    if r.compute == "examples" and r.seconds_per_example is not None:
        return f"priced as examples × {r.seconds_per_example * 1e3:.3g} ms"
    return "measured"


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


def _curves_of(attr: str, members: Sequence[Run]) -> list[list[tuple[float, float]]]:
    return [[(float(getattr(p, attr)), p.value) for p in r.points] for r in members]


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


# -- per-run plots -------------------------------------------------------------------------------------


def _panels(
    firsts: Sequence[tuple[str, Run, int]], title: str, rows_per_run: int = 1
) -> tuple[Any, list[list[Any]]]:
    """A figure of one panel per run (``rows_per_run`` axes stacked, sharing x); each panel's axes, the
    first titled with its run when there are several."""
    from matplotlib.figure import Figure

    n = max(len(firsts), 1)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    one = n == 1
    fig = Figure(
        figsize=(7.6 if one else 4.8 * cols, (4.4 if one else 3.3) * rows * (1 + 0.45 * (rows_per_run - 1))),
        layout="constrained",
    )
    grid = fig.add_gridspec(rows * rows_per_run, cols)
    panels: list[list[Any]] = []
    for k, (label, r, seeds) in enumerate(firsts):
        row, col = divmod(k, cols)
        axs: list[Any] = []
        for j in range(rows_per_run):
            axs.append(fig.add_subplot(grid[row * rows_per_run + j, col], sharex=axs[0] if axs else None))
        if not one:
            axs[0].set_title(label if seeds == 1 else f"{label} (seed {r.seed})", fontsize=9)
        for a in axs:
            a.grid(alpha=0.3)
        panels.append(axs)
    fig.suptitle(title, fontsize=10)
    return fig, panels


def _figure_legend(fig: Any, panels: list[list[Any]], extra: Sequence[Any] = ()) -> None:
    """One legend under the figure: the ``extra`` handles, then every label of its panels once (a
    trainer has the same colour in every panel)."""
    seen: dict[str, Any] = {h.get_label(): h for h in extra}
    for axs in panels:
        for ax in axs:
            for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
                seen.setdefault(lab, h)
    if seen:
        fig.legend(
            list(seen.values()),
            list(seen),
            loc="outside lower center",
            ncol=min(len(seen), 2 if len(panels) == 1 else 3),
            fontsize=7,
        )


def _layered(k: int, n: int) -> float:
    """The line width of series k of n drawn on one another: the first the widest, so that series
    with equal values show as stripes of their colours instead of hiding each other."""
    return 1.2 + 1.1 * (n - 1 - k)


def _requests(ax: Any, r: Run) -> None:
    by: dict[int, dict[int, int]] = {}
    for e in r.of(events.Trainer):
        by.setdefault(e.trainer, {})[e.round] = e.request
    last = max((x for pts in by.values() for x in pts), default=0)
    for k, (t, pts) in enumerate(sorted(by.items())):
        ax.plot(
            list(pts),
            list(pts.values()),
            marker="o",
            markersize=2 + _layered(k, len(by)),
            linewidth=_layered(k, len(by)),
            color=trainer_colour(t),
            label=f"trainer {t}",
        )
    for k, m in enumerate(r.of(events.Merge)):
        x = m.round + 0.5
        for t in m.merged:  # each merged trainer's last request into the merge
            if m.round in by.get(t, {}):
                ax.plot([m.round, x], [by[t][m.round], m.request], ":", color=trainer_colour(t), linewidth=1)
        after = by.get(m.survivor, {}).get(m.round + 1)
        if after is not None:
            ax.plot([x, m.round + 1], [m.request, after], ":", color=trainer_colour(m.survivor), linewidth=1)
        ax.plot(
            [x],
            [m.request],
            "D",
            color="black",
            markersize=5,
            zorder=5,
            label="merge (dotted: the requests merged)" if k == 0 else None,
        )
        ax.annotate(
            "+".join(map(str, m.merged)) + f" → {m.survivor}",
            (x, m.request),
            xytext=(0, 6),
            textcoords="offset points",
            ha="center",
            fontsize=6,
        )
    for change in memberships(r):
        _membership_line(ax, change, "black", "change of workers")
    th = switch_threshold(r)
    if th is not None:
        lines = []
        if "threshold" in th.modes:
            lines.append(
                (th.kappa * th.b_max, f"κ·b_max = {th.kappa:g} × {th.b_max} = {th.kappa * th.b_max:g}")
            )
        if any(m in ("accumulate", "cap") for m in th.modes):
            lines.append((float(th.b_max), f"b_max = {th.b_max}"))
        for y, text in lines:
            ax.axhline(
                y,
                color="dimgrey",
                linestyle="--",
                linewidth=1,
                label=f"{text.split(' =')[0]} (κ: config switch.kappa; b_max: {th.source})",
            )
            ax.annotate(
                text,
                (0.99, y),
                xycoords=("axes fraction", "data"),
                xytext=(0, -3),
                textcoords="offset points",
                ha="right",
                va="top",
                fontsize=7,
                color="dimgrey",
            )
    else:
        ax.annotate(
            "κ·b_max not drawn: no worker reached b_max, and config switch.b_max is null",
            (0.01, 0.01),
            xycoords="axes fraction",
            fontsize=6,
            color="dimgrey",
        )
    bound = [b for b in theorem1(r) if b[0] + 1 <= last]  # a bound on a round that ran
    for k, (rnd, t, b, _) in enumerate(bound):
        ax.plot(
            [rnd + 1],
            [b],
            "x",
            color=trainer_colour(t),
            markersize=5,
            label="Theorem 1 lower bound, from the round before (reconstructed, ALGORITHM.md §8)"
            if k == 0
            else None,
        )
    ax.set(xlabel="round", ylabel="request b (examples per worker step)")
    ax.set_ylim(bottom=0)
    _integer_axis(ax.xaxis)
    _integer_axis(ax.yaxis)


def requests_figure(firsts: Sequence[tuple[str, Run, int]]) -> Any:
    """Each trainer's request per round; merges (◆, the merged trainers' requests dotted into it),
    changes of workers, the switch threshold κ·b_max and the Theorem 1 bound."""
    fig, panels = _panels(firsts, "Request b per trainer per round (above κ·b_max a worker accumulates)")
    for (_, r, _), axs in zip(firsts, panels, strict=True):
        _requests(axs[0], r)
    _figure_legend(fig, panels)
    return fig


def trainers_alive_figure(firsts: Sequence[tuple[str, Run, int]]) -> Any:
    """Trainers alive after each round, every run on one axes; lines a little apart so that runs with
    the same count stay visible."""
    from matplotlib.colors import to_hex
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.6, 4.2), layout="constrained")
    ax = fig.add_subplot()
    n = len(firsts)
    markers = "osD^vP*X"
    top = 1
    for k, (label, r, _) in enumerate(firsts):
        start = r.of(events.Start)
        pts = [(0, start[0].trainers if start else int(r.config.get("algorithm", {}).get("trainers", 1)))]
        pts += [(e.round, e.trainers_alive) for e in r.of(events.Round)]
        top = max(top, *(k_ for _, k_ in pts))
        off = (k - (n - 1) / 2) * min(0.05, 0.24 / n) if n > 1 else 0.0
        xs, ys = zip(*pts, strict=True)
        (line,) = ax.step(
            xs,
            [y + off for y in ys],
            where="post",
            marker=markers[k % len(markers)],
            markersize=4,
            label=label,
        )
        for m in memberships(r):
            _membership_line(ax, m, to_hex(line.get_color()), None)
    ax.set(xlabel="round", ylabel="trainers alive", ylim=(0, top + 0.6))
    _integer_axis(ax.xaxis)
    _integer_axis(ax.yaxis)
    ax.grid(alpha=0.3)
    if n > 1:
        _outside_legend(ax, title="runs (drawn a little apart\nwhere they overlap)", title_fontsize=7)
    ax.set_title("Trainers alive after each round (merges, and changes of workers)", fontsize=10)
    return fig


def _allocation(ax: Any, r: Run) -> tuple[set[int], bool]:
    """Which trainer each worker ran for in each round (its worker events), a worker absent from a
    round (after an elastic restart with fewer workers) white. Returns the trainers drawn and whether
    a worker was absent."""
    from matplotlib.colors import to_rgb

    ran: dict[int, dict[int, int]] = {}
    for w in r.of(events.Worker):
        ran.setdefault(w.round, {})[w.worker] = w.trainer
    if not ran:
        return set(), False
    rounds = list(range(1, max(ran) + 1))
    workers = list(range(max(w for by in ran.values() for w in by) + 1))
    white = (1.0, 1.0, 1.0)
    grid = [
        [to_rgb(trainer_colour(ran[x][w])) if w in ran.get(x, {}) else white for x in rounds] for w in workers
    ]
    ax.imshow(
        grid,
        aspect="auto",
        interpolation="nearest",
        extent=(0.5, len(rounds) + 0.5, len(workers) - 0.5, -0.5),
    )
    for m in memberships(r):
        _membership_line(ax, m, "black", "change of workers")
    ax.set(xlabel="round", ylabel="worker")
    _integer_axis(ax.xaxis)
    _integer_axis(ax.yaxis)
    ax.grid(False)
    absent = any(w not in ran.get(x, {}) for x in rounds for w in workers)
    return {t for by in ran.values() for t in by.values()}, absent


def allocation_figure(firsts: Sequence[tuple[str, Run, int]]) -> Any:
    """Worker × round, coloured by the trainer the worker ran for; changes of workers marked."""
    from matplotlib.patches import Patch

    fig, panels = _panels(firsts, "Trainer each worker ran for, per round (colour: trainer)")
    trainers: set[int] = set()
    absent = False
    for (_, r, _), axs in zip(firsts, panels, strict=True):
        drawn, gone = _allocation(axs[0], r)
        trainers |= drawn
        absent |= gone
    handles: list[Any] = [Patch(color=trainer_colour(t), label=f"trainer {t}") for t in sorted(trainers)]
    if absent:
        handles.append(Patch(facecolor="white", edgecolor="grey", label="worker not in the run that round"))
    _figure_legend(fig, panels, handles)
    return fig


def _by_round(r: Run, value: Any) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for w in r.of(events.Worker):
        out.setdefault(w.round, []).append(float(value(w)))
    return out


def batch_figure(firsts: Sequence[tuple[str, Run, int]]) -> Any:
    """Per run, two axes sharing the rounds: examples per inner step (effective = micro-batch ×
    accumulation, and the micro-batch; mean over workers, min–max shaded) and the accumulation steps
    (max over workers): one unit per axis."""
    fig, panels = _panels(
        firsts, "Batch per worker: examples per inner step, and micro-batches accumulated", rows_per_run=2
    )
    for (_, r, _), (top, bottom) in zip(firsts, panels, strict=True):
        for name, value, colour, width in (
            ("effective batch (micro × accumulation)", lambda w: w.effective, "C0", 3.5),
            ("micro-batch", lambda w: w.micro, "C1", 1.3),
        ):
            by = _by_round(r, value)
            xs = sorted(by)
            top.plot(
                xs,
                [statistics.fmean(by[x]) for x in xs],
                marker="o",
                markersize=width + 1,
                linewidth=width,
                color=colour,
                label=f"{name}: mean over workers (shaded: min–max, where they differ)",
            )
            if any(min(v) != max(v) for v in by.values()):
                top.fill_between(
                    xs,
                    [min(by[x]) for x in xs],
                    [max(by[x]) for x in xs],
                    color=colour,
                    alpha=0.15,
                    linewidth=0,
                )
        th = switch_threshold(r)
        if th is not None:
            top.axhline(th.b_max, color="dimgrey", linestyle="--", linewidth=1, label=f"b_max ({th.source})")
        top.set(ylabel="examples")
        top.set_ylim(bottom=0)
        _integer_axis(top.yaxis)
        top.tick_params(labelbottom=False)
        acc = _by_round(r, lambda w: w.accum)
        xs = sorted(acc)
        bottom.plot(
            xs,
            [max(acc[x]) for x in xs],
            marker="o",
            markersize=3,
            color="C2",
            label="accumulation: max over workers",
        )
        bottom.set(xlabel="round", ylabel="micro-batches\nper step")
        bottom.set_ylim(0, max((max(v) for v in acc.values()), default=1) + 0.5)
        _integer_axis(bottom.xaxis)
        _integer_axis(bottom.yaxis)
    _figure_legend(fig, panels)
    return fig


def idle_share_figure(groups: Sequence[tuple[str, Sequence[Run]]]) -> Any:
    """The idle share per round of every run (mean over its trainers; a variant's seeds: their mean,
    min–max shaded); one run alone: each trainer's too, thin."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    fig = Figure(figsize=(8.6, 4.2), layout="constrained")
    ax = fig.add_subplot()
    top = 0.0
    one = len(groups) == 1 and len(groups[0][1]) == 1
    for label, members in groups:
        curves = [[(float(e.round), e.idle_share) for e in r.of(events.Round)] for r in members]
        curves = [c for c in curves if c]
        if not curves:
            continue
        top = max(top, *(y for c in curves for _, y in c))
        if one:
            by: dict[int, list[tuple[int, float]]] = {}
            for e in members[0].of(events.Trainer):
                by.setdefault(e.trainer, []).append((e.round, e.idle_share))
            ax.plot(
                *zip(*curves[0], strict=True),
                color="black",
                linewidth=1.5,
                linestyle="--",
                marker="o",
                markersize=3,
                zorder=3,
                label="mean over trainers (the round's)",
            )
            for k, (t, pts) in enumerate(sorted(by.items())):
                ax.plot(
                    *zip(*pts, strict=True),
                    color=trainer_colour(t),
                    linewidth=_layered(k, len(by)) * 0.8,
                    marker="o",
                    markersize=2 + _layered(k, len(by)) * 0.8,
                    alpha=0.8,
                    label=f"trainer {t}",
                )
                top = max(top, *(y for _, y in pts))
            continue
        _draw_group(ax, label, curves)
    ax.set(xlabel="round", ylabel="idle share", ylim=(0, max(0.05, top * 1.15)))
    if top == 0:
        ax.annotate(
            "0 in every round: one worker per trainer, or a run from before idle shares were logged",
            (0.5, 0.5),
            xycoords="axes fraction",
            ha="center",
            fontsize=8,
            color="dimgrey",
        )
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    _integer_axis(ax.xaxis)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[1]:
        _outside_legend(ax)
    ax.set_title(
        "Idle share per round: 1 − mean/max of a trainer's workers' measured compute times\n"
        "(the share of the round a worker waited for the slowest of its trainer; mean over trainers)",
        fontsize=9,
    )
    return fig


def make_figures(
    runs: list[Run],
    target: float | None = None,
    groups: list[tuple[str, list[Run]]] | None = None,
) -> dict[str, Any]:
    """Every plot, by file name, as matplotlib Figures (see :func:`draw`)."""
    if groups is None:
        groups = [(r.label, [r]) for r in runs]
    groups = [(label, members) for label, members in groups if members]
    short = "val_accuracy" if groups[0][1][0].metric == "val_accuracy" else "val_ppl"
    out: dict[str, Any] = {}
    for attr, (name, _) in CURVES.items():
        out[f"{short}_vs_{name}.png"] = curve_figure(groups, attr, target)
    firsts = [(label, members[0], len(members)) for label, members in groups]
    out["requests.png"] = requests_figure(firsts)
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
