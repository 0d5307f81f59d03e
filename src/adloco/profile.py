"""Step-time profiles (ALGORITHM.md §11): what a worker's inner step costs on a device.

An inner step on micro-batches of m rows, accumulated a times, costs t(m, a) = a·(α + β·m) + δ: α a
micro-batch's fixed cost (kernel launches, weight reads, Python), β its cost per row, δ the optimizer step.
``adloco profile`` times a worker's forward and backward at several micro-batch sizes and its optimizer
step, and fits α and β by least squares; :func:`fit_runs` fits the same three numbers from finished runs'
own rounds instead. A profile prices compute in simulated time (``adloco report --profile``, ``adloco
bench --profile``, ``runtime.profile``), where a bigger batch can then be cheaper per example, as on a
device with a fixed cost per step; the fixed-cost share φ = α/(α + β·b₀) at the first request says how much.

Pure arithmetic and a JSON file: config checks, the driver and the reports read it; the ``adloco profile``
command that measures one on a device is :mod:`adloco.engine.profiling`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adloco.errors import UserError

FORMAT = 1
AUTO = "auto"  # runtime.profile: fitted from the run's own worker rounds


@dataclass(frozen=True)
class StepProfile:
    """α, β, δ in seconds (β per row) of one worker's inner step, and where they were measured."""

    alpha: float
    beta: float
    delta: float
    device: str = ""
    torch: str = ""
    model: str = ""
    seq_len: int = 0
    b_max: int = 0
    residual: float = 0.0  # root mean square of the fit's relative errors
    timings: dict[str, float] = field(default_factory=dict)  # rows of a micro-batch -> seconds (fwd + bwd)
    source: str = "measured"  # measured (adloco profile), fitted (from runs), or how it was derived

    def step_seconds(self, micro: int, accum: int) -> float:
        """t(m, a) = a·(α + β·m) + δ."""
        return accum * (self.alpha + self.beta * micro) + self.delta

    def worker_seconds(self, steps: int, micro: int, accum: int, passes: int = 0, rows: int = 0) -> float:
        """A worker's compute in a round: ``steps`` inner steps of ``accum`` micro-batches of ``micro`` rows,
        plus ``passes`` extra forward and backward passes over ``rows`` extra rows (the gradient probe)."""
        return steps * self.step_seconds(micro, accum) + passes * self.alpha + rows * self.beta

    def fixed_share(self, b0: int) -> float:
        """φ = α/(α + β·b₀): the share of a step at the first request that does not grow with the rows."""
        return self.alpha / (self.alpha + self.beta * b0)

    def with_fixed_share(self, phi: float, b0: int) -> StepProfile:
        """The profile of a device where a micro-batch of b₀ rows costs what it costs here, but φ of it is
        fixed: α = φ·s, β = (1 − φ)·s/b₀ with s = α + β·b₀ (δ unchanged)."""
        if not 0 <= phi < 1:
            raise UserError(f"--fixed-share {phi}: must be in [0, 1)")
        s = self.alpha + self.beta * b0
        return dataclasses.replace(
            self,
            alpha=phi * s,
            beta=(1 - phi) * s / b0,
            source=f"{self.source}, fixed share {phi:g} at b0 {b0}",
        )

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **dataclasses.asdict(self)}

    def save(self, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
            tmp.replace(path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise UserError(f"profile {str(path)!r}: cannot be written ({exc.strerror})") from None

    @classmethod
    def load(cls, path: str | Path, where: str | None = None) -> StepProfile:
        """A profile written by ``adloco profile``; a file that is not one is one line naming it (``where``:
        how the line names it; default ``profile 'PATH'``)."""
        where = where or f"profile {str(path)!r}"
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"{where}: no such file (adloco profile writes one)") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"{where}: not a profile ({type(exc).__name__})") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise UserError(f"{where}: not a profile of format {FORMAT} (adloco profile writes one)")
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            prof = cls(**{k: v for k, v in raw.items() if k in known})
            values = [float(prof.alpha), float(prof.beta), float(prof.delta)]
        except (TypeError, ValueError):
            raise UserError(f"{where}: alpha, beta and delta must be numbers") from None
        if not all(math.isfinite(v) and v >= 0 for v in values) or prof.alpha + prof.beta <= 0:
            raise UserError(f"{where}: alpha, beta and delta must be finite seconds >= 0, not all zero")
        return prof


def fit(timings: Mapping[int, float]) -> tuple[float, float, float]:
    """(α, β, relative residual) of t(m) = α + β·m by least squares over ≥ 2 sizes; α and β are clipped at
    0 (a negative fixed cost is noise)."""
    ms = sorted(timings)
    if len(ms) < 2:
        raise UserError("profile: at least two micro-batch sizes are needed to fit a cost per row")
    n = len(ms)
    mean_m = sum(ms) / n
    mean_t = sum(timings[m] for m in ms) / n
    var = sum((m - mean_m) ** 2 for m in ms)
    beta = max(0.0, sum((m - mean_m) * (timings[m] - mean_t) for m in ms) / var)
    alpha = max(0.0, mean_t - beta * mean_m)
    rel = [((alpha + beta * m) - timings[m]) / timings[m] for m in ms if timings[m] > 0]
    return alpha, beta, math.sqrt(sum(r * r for r in rel) / len(rel)) if rel else 0.0


def measure(
    forward_backward: Callable[[int], None],
    optimizer_step: Callable[[], None],
    sizes: Sequence[int],
    repeats: int,
    synchronize: Callable[[], None] = lambda: None,
) -> tuple[dict[int, float], float]:
    """Median seconds of ``forward_backward(m)`` for every size (after one warm-up each), and of
    ``optimizer_step()``. ``synchronize`` waits for the device (CUDA) before a clock is read."""

    def timed(fn: Callable[[], None]) -> float:
        synchronize()
        t0 = time.perf_counter()
        fn()
        synchronize()
        return time.perf_counter() - t0

    out: dict[int, float] = {}
    for m in sizes:
        forward_backward(m)  # warm-up: allocations, kernels
        out[m] = statistics.median(timed(functools.partial(forward_backward, m)) for _ in range(repeats))
    optimizer_step()
    delta = statistics.median(timed(optimizer_step) for _ in range(repeats))
    return out, delta


def fit_runs(
    rows: Sequence[tuple[float, int, int, int]], what: str = "--profile auto", of: str = ""
) -> StepProfile:
    """α, β, δ fitted from finished rounds: rows of (compute seconds, steps, micro-batches, examples) of
    worker rounds (:class:`RoundSums`)."""
    sums = RoundSums()
    for row in rows:
        sums.add(*row)
    return sums.fit(what, of)


@dataclass
class RoundSums:
    """What a fit of compute ≈ α·passes + β·examples + δ·steps needs from worker rounds, summed as they
    come: n, Σxxᵀ, Σxy, Σy² and, for the relative residual, Σ(x/y)(x/y)ᵀ and Σx/y (x = passes, examples,
    steps; y = compute seconds). A run that fits its own profile (``runtime.profile: auto``) adds each
    round's rows and refits in constant time; its checkpoint holds these few numbers.

    Plain float arithmetic in a fixed order, no BLAS: the same rows give the same bits on every machine, so
    the ranks of such a run share rows by the same α/β."""

    n: int = 0
    gram: list[list[float]] = field(default_factory=lambda: [[0.0] * 3 for _ in range(3)])
    xy: list[float] = field(default_factory=lambda: [0.0] * 3)
    yy: float = 0.0
    rgram: list[list[float]] = field(default_factory=lambda: [[0.0] * 3 for _ in range(3)])
    rx: list[float] = field(default_factory=lambda: [0.0] * 3)

    def add(self, compute: float, steps: int, passes: int, examples: int) -> None:
        """One worker round; one without steps or with no positive, finite time is left out."""
        if steps <= 0 or not math.isfinite(compute) or compute <= 0:
            return
        x = (float(passes), float(examples), float(steps))
        r = [v / compute for v in x]
        self.n += 1
        self.yy += compute * compute
        for i in range(3):
            self.xy[i] += x[i] * compute
            self.rx[i] += r[i]
            for j in range(3):
                self.gram[i][j] += x[i] * x[j]
                self.rgram[i][j] += r[i] * r[j]

    def fit(self, what: str = "--profile auto", of: str = "") -> StepProfile:
        """Least squares with every coefficient ≥ 0. The rounds must have used several micro-batch sizes
        for the fixed and the per-row cost to be told apart; where every step accumulated alike, α and δ
        cannot be told apart and are fitted as one fixed cost per micro-batch (δ = 0), which prices those
        steps exactly. ``what`` names the source in an error, ``of`` says whose rounds they were."""
        if self.n < 3:
            raise UserError(f"{what}: fewer than three worker rounds with steps to fit a profile from")
        source = f"fitted from {self.n} worker rounds{of}"
        if self._independent([0, 1, 2]):
            coef = self._nonnegative_least_squares([0, 1, 2])
        elif self._independent([0, 1]):
            coef = self._nonnegative_least_squares([0, 1])
            source += ", α with the optimizer step in it (the steps all accumulated alike)"
        else:
            raise UserError(
                f"{what}: the steps all used one micro-batch size, so a step's fixed cost and its "
                "cost per row cannot be told apart; measure a profile with adloco profile and pass its file"
            )
        # mean of ((x·c − y)/y)² = (cᵀ Σ(x/y)(x/y)ᵀ c − 2 cᵀ Σx/y + n) / n
        quad = sum(coef[i] * self.rgram[i][j] * coef[j] for i in range(3) for j in range(3))
        mean = (quad - 2 * sum(c * r for c, r in zip(coef, self.rx, strict=True)) + self.n) / self.n
        alpha, beta, delta = coef
        return StepProfile(alpha, beta, delta, residual=math.sqrt(max(0.0, mean)), source=source)

    def _independent(self, cols: list[int]) -> bool:
        """Whether these columns are far from dependent: the determinant of their Gram matrix of cosines
        (1 for orthogonal columns, 0 for dependent ones) is at least 1e-6."""
        norms = [math.sqrt(self.gram[j][j]) for j in cols]
        if min(norms) == 0:
            return False
        cos = [
            [self.gram[i][j] / (ni * nj) for j, nj in zip(cols, norms, strict=True)]
            for i, ni in zip(cols, norms, strict=True)
        ]
        return _solve(cos, [0.0] * len(cols)) is not None and _det(cos) >= 1e-6

    def _nonnegative_least_squares(self, cols: list[int]) -> list[float]:
        """min ‖x·c − y‖² over c ≥ 0 on these columns (the others 0), exactly: the unconstrained fit on
        every subset of them (the rest held at 0), the best of those with no negative coefficient."""
        best: tuple[float, list[float]] = (math.inf, [0.0] * 3)
        for mask in range(1, 1 << len(cols)):
            free = [j for i, j in enumerate(cols) if mask >> i & 1]
            c = _solve([[self.gram[i][j] for j in free] for i in free], [self.xy[i] for i in free])
            if c is None or min(c) < 0:
                continue
            full = [0.0] * 3
            for j, v in zip(free, c, strict=True):
                full[j] = v
            quad = sum(full[i] * self.gram[i][j] * full[j] for i in range(3) for j in range(3))
            sse = quad - 2 * sum(f * b for f, b in zip(full, self.xy, strict=True)) + self.yy
            if sse < best[0]:
                best = (sse, full)
        return best[1]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RoundSums:
        return cls(
            int(d["n"]),
            [[float(v) for v in row] for row in d["gram"]],
            [float(v) for v in d["xy"]],
            float(d["yy"]),
            [[float(v) for v in row] for row in d["rgram"]],
            [float(v) for v in d["rx"]],
        )


def _det(a: list[list[float]]) -> float:
    if len(a) == 1:
        return a[0][0]
    return sum((-1) ** j * a[0][j] * _det([row[:j] + row[j + 1 :] for row in a[1:]]) for j in range(len(a)))


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """x with a·x = b (Gaussian elimination with partial pivoting), or None when a is singular."""
    n = len(b)
    m = [[*row, v] for row, v in zip(a, b, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda i: abs(m[i][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-300:
            return None
        for i in range(col + 1, n):
            f = m[i][col] / m[col][col]
            m[i] = [vi - f * vc for vi, vc in zip(m[i], m[col], strict=True)]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (m[i][n] - sum(m[i][j] * x[j] for j in range(i + 1, n))) / m[i][i]
    return x
