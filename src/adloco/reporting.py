"""Plots and a markdown report from run directories alone: one run (drawn at the end of ``adloco
train``), several (``adloco report``), or a bench's variants over several seeds (``adloco bench``).
Never inside the training loop.

Every number comes from a run's ``metrics.jsonl`` (read as typed events, :mod:`adloco.events`),
``summary.json`` and ``config.yaml``. Simulated time is recomputed from the logged per-worker compute
and collectives with the network model (ALGORITHM.md §7), so it can be priced for another network without
re-running anything. A worker's compute in a round is either its measured ``compute_s`` (``measured``)
or its examples in the round times one seconds-per-example constant shared by every compared run
(``examples``: independent of machine load, see :func:`price`). Each plot is drawn once, by one
function, whatever the number of runs; a variant run on several seeds is drawn as its mean curve with
a min–max band (:func:`mean_curve`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from adloco import events, netmodel
from adloco.errors import UserError
from adloco.telemetry.progress import fmt_bytes

E = TypeVar("E", bound=events.Event)

COMPUTE = ("measured", "examples")


@dataclass
class Point:
    """One evaluation: the run's state when it was measured."""

    round: int
    examples: int
    communications: int
    bytes: int
    sim_s: float
    value: float  # validation perplexity (or accuracy, for classification)


@dataclass
class Run:
    path: Path
    label: str
    config: dict[str, Any]
    summary: dict[str, Any]
    events: list[events.Event]
    bandwidth: float = 125e6  # the network simulated time was priced on
    latency: float = 1e-3
    metric: str = "val_ppl"  # or val_accuracy
    points: list[Point] = field(default_factory=list)
    end: Point | None = None  # the last round (its value: the final metric)
    compute: str = "measured"  # how a worker's compute was priced: measured | examples
    seconds_per_example: float | None = None  # the constant of `examples`
    compute_note: str = ""  # where that constant came from

    @property
    def method(self) -> str:
        return str(self.config.get("algorithm", {}).get("method", "?"))

    @property
    def seed(self) -> int:
        return int(self.config.get("algorithm", {}).get("seed", 0))

    @property
    def final(self) -> float:
        """The final metric; a run whose final evaluation was not finite gives inf (nan for accuracy)."""
        if self.end is None:
            return math.nan
        key = "final_val_accuracy" if self.metric == "val_accuracy" else "final_val_ppl"
        if key in self.summary and self.summary[key] is None:
            return math.nan if self.metric == "val_accuracy" else math.inf
        return self.end.value

    def of(self, kind: type[E]) -> list[E]:
        return events.of(self.events, kind)


def load(
    path: Path,
    bandwidth: float | None = None,
    latency: float | None = None,
    compute: str = "measured",
    seconds_per_example: float | None = None,
) -> Run:
    """Read one run directory (one line of error if it is not a run directory with a start event).

    ``compute="examples"`` without ``seconds_per_example`` prices this run alone by its own median; to
    compare runs on one constant, load them and call :func:`price` on all of them (:func:`load_all`).
    """
    where = f"run directory {str(path)!r}"
    for name in ("config.yaml", "metrics.jsonl"):
        if not (path / name).is_file():
            raise UserError(f"{where}: no {name} (not a run directory)")
    try:
        config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError):
        raise UserError(f"{where}: config.yaml is corrupt (not YAML)") from None
    evs = events.read(path / "metrics.jsonl")
    summary: dict[str, Any] = {}
    if (path / "summary.json").is_file():
        try:
            summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError(f"{where}: summary.json is corrupt (not JSON)") from None
    label = config.get("logging", {}).get("name") or config.get("algorithm", {}).get("method") or path.name
    run = Run(path, str(label), config, summary, evs)
    net = config.get("network", {})
    run.bandwidth = bandwidth or float(net.get("bandwidth", 125e6))
    run.latency = latency if latency is not None else float(net.get("latency", 1e-3))
    start = next(iter(run.of(events.Start)), None)
    if start is None:
        raise UserError(f"{where}: no start event (the run stopped before its first evaluation)")
    run.metric = "val_accuracy" if start.task == "classification" else "val_ppl"
    if getattr(start, run.metric) is None:
        raise UserError(f"{where}: its start event holds no {run.metric}")
    price([run], compute, seconds_per_example)
    return run


def load_all(
    paths: Sequence[Path],
    bandwidth: float | None = None,
    latency: float | None = None,
    compute: str = "measured",
    seconds_per_example: float | None = None,
) -> list[Run]:
    """Several run directories, priced together (one seconds-per-example constant for all)."""
    runs = [load(p, bandwidth, latency) for p in paths]
    price(runs, compute, seconds_per_example)
    return runs


def add_compute_options(p: argparse.ArgumentParser, default: str) -> None:
    """``--compute`` and ``--seconds-per-example``, for every command that prices simulated time."""
    p.add_argument(
        "--compute",
        choices=COMPUTE,
        default=default,
        help="simulated compute per worker and round: its measured compute time, or its examples times "
        "one seconds-per-example constant shared by all compared runs (independent of machine load; "
        f"default: {default})",
    )
    p.add_argument(
        "--seconds-per-example",
        type=float,
        metavar="S",
        help="the constant of --compute examples (default: the median of compute_s / examples over every "
        "worker event of the compared runs)",
    )


def median_seconds_per_example(runs: Sequence[Run]) -> tuple[float, int]:
    """(median of compute_s / examples over every worker event with examples, number of such events).

    A worker's examples are those of its optimizer steps and of its gradient probes: both cost compute."""
    ratios = [
        w.compute_s / n
        for r in runs
        for w in r.of(events.Worker)
        if (n := w.examples + w.probe_examples) > 0 and math.isfinite(w.compute_s)
    ]
    if not ratios:
        raise UserError(
            "--compute examples: no worker event with examples to price a second per example from"
        )
    return statistics.median(ratios), len(ratios)


def price(runs: Sequence[Run], compute: str = "measured", seconds_per_example: float | None = None) -> None:
    """(Re)compute every run's points: simulated time with ``compute`` (``measured``: each worker's
    ``compute_s``; ``examples``: its examples in the round x one constant, by default the median of
    :func:`median_seconds_per_example` over all of ``runs``), on each run's network."""
    if compute not in COMPUTE:
        raise UserError(f"--compute {compute!r}: must be one of {', '.join(COMPUTE)}")
    note = ""
    if compute == "examples":
        if seconds_per_example is None:
            seconds_per_example, n = median_seconds_per_example(runs)
            note = (
                f"the median of compute_s / examples over {n:,} worker events of "
                f"{len(runs)} run{'s' if len(runs) != 1 else ''}"
            )
        elif not (seconds_per_example > 0 and math.isfinite(seconds_per_example)):
            raise UserError(f"--seconds-per-example {seconds_per_example}: must be > 0")
        else:
            note = "given (--seconds-per-example)"
    else:
        seconds_per_example = None
    for r in runs:
        r.compute, r.seconds_per_example, r.compute_note = compute, seconds_per_example, note
        _points(r)


def _points(run: Run) -> None:
    speeds = run.config.get("runtime", {}).get("worker_speeds") or []  # runs before emulate_speed replaced it
    compute: dict[int, dict[int, float]] = {}
    spe = run.seconds_per_example
    for we in run.of(events.Worker):
        c = we.compute_s if spe is None else (we.examples + we.probe_examples) * spe
        compute.setdefault(we.round, {})[we.worker] = c
    start = run.of(events.Start)[0]
    sim = 0.0
    run.points = [Point(0, 0, 0, 0, 0.0, float(getattr(start, run.metric)))]
    run.end = run.points[0]
    for e in run.of(events.Round):
        sim += netmodel.round_seconds(
            compute.get(e.round, {}), e.collectives, run.bandwidth, run.latency, speeds
        )
        value = getattr(e, run.metric)
        if value is not None:
            run.points.append(
                Point(e.round, e.examples_total, e.communications_total, e.bytes_total, sim, float(value))
            )
        last = run.points[-1].value
        run.end = Point(e.round, e.examples_total, e.communications_total, e.bytes_total, sim, last)


def compute_sentence(runs: Sequence[Run]) -> str:
    """How simulated compute was priced, for a report."""
    r = runs[0]
    if r.compute == "examples" and r.seconds_per_example is not None:
        return (
            "the slowest worker's compute per round, priced as its examples in the round (optimizer steps "
            f"and gradient probes) x **{r.seconds_per_example * 1e3:.4g} ms per example** for every run "
            f"({r.compute_note}; `--compute examples`: independent of machine load, it also prices every "
            "batch size alike),"
        )
    return (
        "the slowest worker's measured compute per round (with `runtime.emulate_speed`'s sleeps; "
        "`--compute measured`: it grows with machine load)"
    )


def reach(run: Run, target: float) -> Point | None:
    """The first evaluation at or below the target perplexity (at or above, for accuracy)."""
    for p in run.points:
        if (p.value >= target) if run.metric == "val_accuracy" else (p.value <= target):
            return p
    return None


def theorem1(run: Run) -> list[tuple[int, int, float, int]]:
    """(round, trainer, Theorem 1 lower bound on the next request, the next request) per trainer event.

    Reconstructed statement (ALGORITHM.md §8): E[b_{k+1}] ≥ σ²/(M η² (‖∇F‖² + σ²/(M b_k))), with the logged
    estimates of σ² and ‖ḡ‖² for ‖∇F‖², M the trainer's workers and η from the config.
    """
    eta = float(run.config.get("batch", {}).get("eta", 0.65))
    out = []
    for e in run.of(events.Trainer):
        if e.sigma2 is None or e.gbar_sq is None:
            continue
        m, b = len(e.workers), e.request
        bound = e.sigma2 / (m * eta**2 * (e.gbar_sq + e.sigma2 / (m * b)))
        out.append((e.round, e.trainer, bound, e.request_next))
    return out


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


# -- several seeds ----------------------------------------------------------------------------------


def t_quantile(df: int, p: float = 0.975) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (p > 0.5), by bisection on its
    closed-form distribution function for integer df (Abramowitz & Stegun 26.7.3 and 26.7.4)."""
    if df < 1 or not 0.5 < p < 1:
        raise ValueError(f"t_quantile: df {df}, p {p}")
    central = 2 * p - 1  # P(|T| <= t)

    def cdf(t: float) -> float:
        theta = math.atan(t / math.sqrt(df))
        c2, s = math.cos(theta) ** 2, math.sin(theta)
        if df % 2:
            term = acc = math.cos(theta) if df > 1 else 0.0
            for k in range(1, (df - 1) // 2):
                term *= c2 * (2 * k) / (2 * k + 1)
                acc += term
            return 2 / math.pi * (theta + s * acc)
        term = acc = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            acc += term
        return s * acc

    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < central else (lo, mid)
    return (lo + hi) / 2


@dataclass
class Stats:
    """A figure over seeds: mean, min, max and the half-width of the 95% Student-t interval of the mean
    (``half``, from 3 values on: t_{0.975, n-1} · s / √n, s the sample standard deviation)."""

    n: int
    mean: float
    min: float
    max: float
    half: float | None = None

    def to_dict(self) -> dict[str, Any]:
        ci = None if self.half is None else [self.mean - self.half, self.mean + self.half]
        return {
            "n": self.n,
            "mean": events.num(self.mean),
            "min": events.num(self.min),
            "max": events.num(self.max),
            "ci95": None if ci is None else [events.num(x) for x in ci],
        }


def stats(values: Sequence[float]) -> Stats | None:
    """Mean, min–max and (3 values or more) the 95% t-interval; None for no values."""
    xs = [float(v) for v in values]
    if not xs:
        return None
    n = len(xs)
    mean = math.fsum(xs) / n if all(math.isfinite(x) for x in xs) else sum(xs) / n  # inf or nan
    half = None
    if n >= 3 and math.isfinite(mean):
        sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
        half = t_quantile(n - 1) * sd / math.sqrt(n)
    return Stats(n, mean, min(xs), max(xs), half)


def interpolate(points: Sequence[tuple[float, float]], xs: Sequence[float]) -> list[float | None]:
    """The piecewise-linear curve through ``points`` (in order of x; where x repeats, the last point
    counts) at each of ``xs``; None outside the curve's x range: never extrapolated."""
    px: list[float] = []
    py: list[float] = []
    for x, y in points:
        if px and x == px[-1]:
            py[-1] = float(y)
        else:
            px.append(float(x))
            py.append(float(y))
    out: list[float | None] = []
    j = 0
    for x in xs:
        if not px or x < px[0] or x > px[-1]:
            out.append(None)
            continue
        while j > 0 and px[j] > x:
            j -= 1
        while j + 1 < len(px) and px[j + 1] <= x:
            j += 1
        if px[j] == x or j + 1 == len(px):
            out.append(py[j])
        else:
            w = (x - px[j]) / (px[j + 1] - px[j])
            out.append(py[j] + w * (py[j + 1] - py[j]))
    return out


def mean_curve(
    curves: Sequence[Sequence[tuple[float, float]]],
) -> tuple[list[float], list[float], list[float], list[float]]:
    """(x, mean, min, max) of several curves (one per seed) on a common grid: the union of their x
    values within the range every curve covers, each curve interpolated linearly onto it. Beyond the
    shortest curve's last x nothing is averaged (no curve is extrapolated)."""
    curves = [c for c in curves if c]
    if not curves:
        return [], [], [], []
    lo = max(c[0][0] for c in curves)
    hi = min(c[-1][0] for c in curves)
    grid = sorted({float(x) for c in curves for x, _ in c if lo <= x <= hi})
    at = [interpolate(c, grid) for c in curves]
    xs, mean, mn, mx = [], [], [], []
    for k, x in enumerate(grid):
        ys = [a[k] for a in at]
        vals = [y for y in ys if y is not None]
        if len(vals) != len(curves):
            continue
        xs.append(x)
        mean.append(math.fsum(vals) / len(vals))
        mn.append(min(vals))
        mx.append(max(vals))
    return xs, mean, mn, mx


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


def memberships(run: Run) -> list[events.Membership]:
    """The run's changes of workers (elastic restarts, resumes on another number of workers)."""
    return run.of(events.Membership)


def membership_text(m: events.Membership) -> str:
    if m.workers != m.workers_before:
        return f"{m.workers_before} → {m.workers} workers"
    return f"restart ({m.workers} workers)"


@dataclass
class Threshold:
    """Where a run's workers start to accumulate: κ, b_max and where b_max was read."""

    kappa: float
    b_max: int
    source: str  # "the workers' micro-batch" or "config switch.b_max"
    modes: list[str]  # the switch modes its rounds ran in


def switch_threshold(run: Run) -> Threshold | None:
    """κ (config ``switch.kappa``) and b_max: the largest micro-batch of the worker events that
    accumulated or were capped (their micro-batch is b_max exactly), else config ``switch.b_max``; None
    when neither says (no worker reached b_max, and the config left it to the device)."""
    from adloco.config import SwitchConfig

    sw = run.config.get("switch") or {}
    kappa = float(sw.get("kappa", SwitchConfig().kappa))
    modes = sorted({e.switch_mode for e in run.of(events.Round)}) or [str(sw.get("mode", "threshold"))]
    full = [w.micro for w in run.of(events.Worker) if w.accum > 1 or w.capped]
    if full:
        return Threshold(kappa, max(full), "the workers' micro-batch", modes)
    if sw.get("b_max"):
        return Threshold(kappa, int(sw["b_max"]), "config switch.b_max", modes)
    return None


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
        title += f"\nsimulated on {_network(runs)}; compute {_compute_words(runs)}"
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


# -- the report -------------------------------------------------------------------------------------


def default_target(runs: Sequence[Run]) -> float:
    """The worst final metric among the runs (every run reaches it): the highest perplexity, or the
    lowest accuracy; a run whose final evaluation was not finite does not count."""
    finals = [r.final for r in runs if math.isfinite(r.final)] or [r.end.value for r in runs if r.end]
    return max(finals) if runs[0].metric == "val_ppl" else min(finals)


def _network(runs: Sequence[Run]) -> str:
    nets = {(r.bandwidth, r.latency) for r in runs}
    bw, lat = runs[0].bandwidth, runs[0].latency
    return (
        f"{bw / 1e6:g} MB/s and {lat * 1e3:g} ms latency"
        if len(nets) == 1
        else "each run's own network (`network` in its config.yaml)"
    )


def _what(runs: Sequence[Run]) -> str:
    return "perplexity" if runs[0].metric == "val_ppl" else "accuracy"


def _sim_sentence(runs: Sequence[Run]) -> str:
    return (
        f"Simulated time: {compute_sentence(runs)} plus every counted collective on {_network(runs)} "
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
    drawn = draw(runs, out / "plots", target)
    lines = ["# adloco comparison", ""]
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
