"""The plots of what the trainers and workers did, round by round, from run directories alone: each
trainer's request (with merges, the switch threshold and the Theorem 1 bound), the trainers alive,
which trainer each worker ran for, the batch per worker, and the idle share. A per-run plot has one
panel per run (a bench's variant: its first seed); :func:`adloco.report.plots.make_figures` builds them
with the curve plots."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from adloco import events
from adloco.report.plot_parts import (
    _draw_group,
    _integer_axis,
    _membership_line,
    _outside_legend,
    trainer_colour,
)
from adloco.report.results import Run, memberships, switch_threshold, theorem1


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
            label="merge of trainers (dotted: the requests merged; label: merged → the one kept)"
            if k == 0
            else None,
        )
        ax.annotate(
            "+".join(f"t{t}" for t in m.merged) + f" → t{m.survivor}",
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
            name = text.split(" =")[0]
            ax.axhline(
                y,
                color="dimgrey",
                linestyle="--",
                linewidth=1,
                label=f"κ·b_max: above it a worker accumulates micro-batches (b_max: {th.source})"
                if name.startswith("κ")
                else f"b_max ({th.source}): above it, switch mode accumulate accumulates and cap caps",
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
            label="lowest request the paper's Theorem 1 allows, from the round before (constants reconstructed)"
            if k == 0
            else None,
        )
    ax.set(xlabel="round", ylabel="request b (examples per worker step)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.06)  # room above the top request for a merge's label
    _integer_axis(ax.xaxis)
    _integer_axis(ax.yaxis)


def lrs(r: Run) -> dict[int, dict[int, float]]:
    """Each trainer's inner lr at each round's last step (batch.lr_scaling's multiplier in it), by round."""
    lr: dict[int, dict[int, float]] = {}
    for e in r.of(events.Trainer):
        if e.lr is not None:
            lr.setdefault(e.trainer, {})[e.round] = e.lr
    return lr


def lr_moved(firsts: Sequence[tuple[str, Run, int]]) -> bool:
    """Whether any run recorded an inner lr that changed (the lr plot is drawn only then)."""
    return any(len({v for pts in lrs(r).values() for v in pts.values()}) > 1 for _, r, _ in firsts)


def lr_figure(firsts: Sequence[tuple[str, Run, int]]) -> Any:
    """Each trainer's inner lr per round: the schedule times the multiplier that follows its batch
    (ALGORITHM.md §10), a plot of its own so that the requests plot keeps one axis."""
    fig, panels = _panels(
        firsts,
        "Inner learning rate per trainer at each round's last step\n"
        "(the schedule times batch.lr_scaling's multiplier, which follows the trainer's batch)",
    )
    for (_, r, _), axs in zip(firsts, panels, strict=True):
        ax = axs[0]
        for t, pts in sorted(lrs(r).items()):
            ax.plot(
                list(pts),
                list(pts.values()),
                marker="o",
                markersize=3,
                color=trainer_colour(t),
                label=f"t{t}",
            )
        ax.set(xlabel="round", ylabel="inner lr")
        ax.set_ylim(bottom=0)
        _integer_axis(ax.xaxis)
        ax.legend(title="trainer", fontsize=7, title_fontsize=7)
    return fig


def requests_figure(firsts: Sequence[tuple[str, Run, int]]) -> Any:
    """Each trainer's request per round; merges (◆, the merged trainers' requests dotted into it),
    changes of workers, the switch threshold κ·b_max and the Theorem 1 bound."""
    fig, panels = _panels(
        firsts,
        "Request b per trainer per round (examples each of its workers takes per inner step)\n"
        "◆ trainers merged, dashed: the micro-batch limit, ×: the paper's Theorem 1 lower bound",
    )
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
