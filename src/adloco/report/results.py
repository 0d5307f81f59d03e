"""Run directories read back: each run's evaluations as points along examples, communications, bytes
and simulated time; pricing of simulated time; statistics over seeds. What :mod:`adloco.report.plots` draws
and :mod:`adloco.report.markdown` tabulates.

Every number comes from a run's ``metrics.jsonl`` (read as typed events, :mod:`adloco.events`),
``summary.json`` and ``config.yaml``. Simulated time is recomputed from the logged per-worker compute
and collectives with the network model (ALGORITHM.md §7), so it can be priced for another network without
re-running anything. A worker's compute in a round is either its measured ``compute_s`` (``measured``)
or its examples in the round times one seconds-per-example constant shared by every compared run
(``examples``: independent of machine load, see :func:`price`). A variant run on several seeds is
summarised by :func:`stats` and drawn as its mean curve with a min–max band (:func:`mean_curve`).
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
from adloco.profile import StepProfile

E = TypeVar("E", bound=events.Event)

COMPUTE = ("measured", "examples", "profile")


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
    compute: str = "measured"  # how a worker's compute was priced: measured | examples | profile
    seconds_per_example: float | None = None  # the constant of `examples`
    compute_note: str = ""  # where that constant (or the profile) came from
    profile: StepProfile | None = None  # the step-time profile of `profile` (ALGORITHM.md §11)

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
    profile: str | None = None,
    fixed_share: float | None = None,
) -> list[Run]:
    """Several run directories, priced together (one seconds-per-example constant, or one profile, for all)."""
    runs = [load(p, bandwidth, latency) for p in paths]
    price(runs, compute, seconds_per_example, profile, fixed_share)
    return runs


def add_compute_options(p: argparse.ArgumentParser, default: str) -> None:
    """``--compute`` and ``--seconds-per-example``, for every command that prices simulated time."""
    p.add_argument(
        "--compute",
        choices=("measured", "examples"),
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
    p.add_argument(
        "--profile",
        metavar="PATH|auto",
        help="price each worker's compute by a step-time profile t(m, a) = a(α + βm) + δ (adloco profile "
        "writes one; auto: fitted from the runs' own rounds), so a bigger micro-batch can cost less per "
        "example (ALGORITHM.md §11); overrides --compute",
    )
    p.add_argument(
        "--fixed-share",
        type=float,
        metavar="PHI",
        help="with --profile: the device whose micro-batch of the first request costs what the profile's "
        "does, but PHI of it is fixed cost (α = PHI·s, β = (1 − PHI)·s/b₀)",
    )


def median_seconds_per_example(runs: Sequence[Run]) -> tuple[float, int]:
    """(median of compute_s / examples over every worker event with examples, number of such events).

    A worker's examples are those of its optimizer steps and of its gradient probes: both cost compute."""
    ratios = [
        w.compute_s / n
        for r in runs
        for w in r.of(events.Worker)
        if (n := (w.examples or 0) + w.probe_examples) > 0 and math.isfinite(w.compute_s)
    ]
    if not ratios:
        raise UserError(
            "--compute examples: no worker event with examples to price a second per example from"
        )
    return statistics.median(ratios), len(ratios)


def price(
    runs: Sequence[Run],
    compute: str = "measured",
    seconds_per_example: float | None = None,
    profile: str | StepProfile | None = None,
    fixed_share: float | None = None,
) -> None:
    """(Re)compute every run's points: simulated time with ``compute`` (``measured``: each worker's
    ``compute_s``; ``examples``: its examples in the round x one constant, by default the median of
    :func:`median_seconds_per_example` over all of ``runs``; ``profile``, implied by ``profile``: each
    worker's steps priced by a step-time profile, a file, ``auto`` (:func:`fit_profile`) or a
    :class:`~adloco.profile.StepProfile`, optionally at another fixed-cost share), on each run's
    network."""
    if fixed_share is not None and profile is None:
        raise UserError("--fixed-share: needs --profile (the step time it re-splits)")
    if profile is not None:
        prof = fit_profile(runs) if profile == "auto" else profile
        if not isinstance(prof, StepProfile):
            prof = StepProfile.load(str(prof))
        if fixed_share is not None:
            prof = prof.with_fixed_share(fixed_share, first_request(runs))
        for r in runs:
            r.compute, r.seconds_per_example, r.profile, r.compute_note = "profile", None, prof, prof.source
            _points(r)
        return
    if compute not in COMPUTE or compute == "profile":
        raise UserError(f"--compute {compute!r}: must be measured or examples (or give --profile)")
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
        r.compute, r.seconds_per_example, r.compute_note, r.profile = compute, seconds_per_example, note, None
        _points(r)


def first_request(runs: Sequence[Run]) -> int:
    """b₀, the first request of the runs (the fixed-cost share is defined at it; the first run's)."""
    return int(runs[0].config.get("batch", {}).get("initial", 4)) if runs else 4


def fit_profile(runs: Sequence[Run]) -> StepProfile:
    """``--profile auto``: α, β, δ fitted from every worker round of ``runs`` (their measured compute)."""
    from adloco.profile import fit_runs

    rows = []
    for r in runs:
        for w in r.of(events.Worker):
            eff = w.micro * w.accum
            steps = (w.examples or 0) // eff if eff else 0
            rows.append((w.compute_s, steps, steps * w.accum, (w.examples or 0) + w.probe_examples))
    return fit_runs(rows)


def _probe_passes(run: Run) -> dict[tuple[int, int], int]:
    """(round, worker) -> forward and backward passes the gradient probe added to the worker's first step:
    its share of the trainer's pooled chunks beyond the step's own micro-batches."""
    out: dict[tuple[int, int], int] = {}
    accum = {(w.round, w.worker): w.accum for w in run.of(events.Worker)}
    for t in run.of(events.Trainer):
        if t.samples:
            k = max(1, round(t.samples / max(1, len(t.workers))))
            for w in t.workers:
                out[(t.round, w)] = max(0, k - accum.get((t.round, w), 1))
    return out


def _profile_seconds(
    run: Run, prof: StepProfile, passes: dict[tuple[int, int], int], w: events.Worker
) -> float:
    eff = w.micro * w.accum
    steps = (w.examples or 0) // eff if eff else 0
    return prof.worker_seconds(steps, w.micro, w.accum, passes.get((w.round, w.worker), 0), w.probe_examples)


def _points(run: Run) -> None:
    speeds = run.config.get("runtime", {}).get("worker_speeds") or []  # runs before emulate_speed replaced it
    compute: dict[int, dict[int, float]] = {}
    spe, prof = run.seconds_per_example, run.profile
    passes = _probe_passes(run) if prof is not None else {}
    for we in run.of(events.Worker):
        if prof is not None:
            c = _profile_seconds(run, prof, passes, we)
        else:
            c = we.compute_s if spe is None else ((we.examples or 0) + we.probe_examples) * spe
        compute.setdefault(we.round, {})[we.worker] = c
    start = run.of(events.Start)[0]
    sim = 0.0
    run.points = [Point(0, 0, 0, 0, 0.0, float(getattr(start, run.metric)))]
    run.end = run.points[0]
    trainers: dict[int, list[list[int]]] = {}
    for te in run.of(events.Trainer):
        trainers.setdefault(te.round, []).append(te.workers)
    for e in run.of(events.Round):
        for field_, behind in (("collectives", False), ("collectives_behind", True)):
            bad = netmodel.bad_row(getattr(e, field_), behind)
            if bad is not None:
                raise UserError(
                    f"run directory {str(run.path)!r}: metrics.jsonl, round {e.round}: {field_} row {bad!r} "
                    "is not [kind, op, n, payload bytes, count, "
                    + ("share]" if behind else "worker ids] (the ids optional)")
                )
        rows = netmodel.name_workers(e.collectives, trainers.get(e.round, []))
        sim += netmodel.round_time(
            compute.get(e.round, {}),
            rows,
            run.bandwidth,
            run.latency,
            speeds,
            e.collectives_behind,
            _net(run),
        ).seconds
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
    if r.compute == "profile" and r.profile is not None:
        p = r.profile
        return (
            f"each worker's compute per round, priced by a step-time profile ({r.compute_note}): a step "
            f"of a micro-batches of m rows costs a·(**{p.alpha * 1e3:.3g} ms + {p.beta * 1e3:.3g} ms·m**) + "
            f"{p.delta * 1e3:.3g} ms (fixed-cost share at b₀ = {first_request(runs)}: "
            f"{p.fixed_share(first_request(runs)):.2f}; `--profile`),"
        )
    if r.compute == "examples" and r.seconds_per_example is not None:
        return (
            "each worker's compute per round, priced as its examples in the round (optimizer steps "
            f"and gradient probes) x **{r.seconds_per_example * 1e3:.4g} ms per example** for every run "
            f"({r.compute_note}; `--compute examples`: independent of machine load, it also prices every "
            "batch size alike),"
        )
    return (
        "each worker's measured compute per round (with `runtime.emulate_speed`'s sleeps; "
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


def network_text(runs: Sequence[Run]) -> str:
    """The simulated network of the runs, in words."""
    nets = {(r.bandwidth, r.latency) for r in runs}
    bw, lat = runs[0].bandwidth, runs[0].latency
    return (
        f"{bw / 1e6:g} MB/s and {lat * 1e3:g} ms latency"
        if len(nets) == 1
        else "each run's own network (`network` in its config.yaml)"
    )


def memberships(run: Run) -> list[events.Membership]:
    """The run's changes of workers (elastic restarts, resumes on another number of workers)."""
    return run.of(events.Membership)


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


def _net(run: Run) -> Any:
    """The run's links (its config's upload and sites) at the bandwidth and latency it is priced on now."""
    net = run.config.get("network", {}) or {}
    sites = [int(m) for m in net.get("sites") or []]
    upload = net.get("upload")
    return netmodel.network(
        run.bandwidth,
        run.latency,
        None if upload is None else float(upload),
        sites if len(sites) > 1 else [],
        float(net.get("site_bandwidth", 12.5e6)),
        float(net.get("site_latency", 0.05)),
    )
