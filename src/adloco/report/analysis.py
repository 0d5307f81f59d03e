"""``adloco analyze-gradients``: gradient noise at one checkpoint, and what the batch tests estimate of it.

At a trainer's θ (float32, dropout off) over N training examples drawn from the trainer's subset, taken
as the population:

* G, the mean gradient over the N examples, and σ² = Σ_i ‖g_i − G‖² / (N − 1) from one backward per
  example (memory: three P-vectors, N scalars);
* for each batch size b, ‖g_B − G‖² of R minibatches drawn without replacement, against the
  finite-population theory E‖g_B − G‖² = σ²/b · (N − b)/N;
* the estimators of ALGORITHM.md §2.5 at the same θ, M emulated workers with disjoint batches of b examples:
  ``pooled`` (chunk gradients laid out by :func:`batching.probe_layout`) and ``paper`` (one gradient of b
  examples per worker; at a common θ, so without the drift of the reference's last inner step), each
  with the norm-test target T against the true σ² / (M η² ‖G‖²).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from adloco.config import Config, resolve
from adloco.config.load import as_it_ran
from adloco.data.sampling import trainer_subset
from adloco.errors import UserError
from adloco.library.algorithms import batching
from adloco.library.settings import AdaptiveBatch

if TYPE_CHECKING:  # torch and the model stack load only when the command runs
    import torch

    from adloco.data.tokens import Data
    from adloco.engine.checkpoint import Checkpoint
    from adloco.library.flat import FlatModule

    Batch = dict[str, torch.Tensor]

DEFAULT_SIZES = "1,2,4,8,16,32"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add the ``analyze-gradients`` subcommand and its options."""
    p = sub.add_parser(
        "analyze-gradients",
        help="gradient variance at a checkpoint: minibatch deviations against theory and the batch tests",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        metavar="PATH",
        help="a run directory (its newest checkpoint) or one of its checkpoints/round-NNNNNN folders",
    )
    p.add_argument("--trainer", type=int, metavar="T", help="trainer to analyze (default: the lowest id)")
    p.add_argument(
        "--examples", type=int, default=512, metavar="N", help="examples of the full gradient (default 512)"
    )
    p.add_argument(
        "--batch-sizes",
        default=DEFAULT_SIZES,
        metavar="B1,B2,...",
        help=f"minibatch sizes (default {DEFAULT_SIZES})",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=32,
        metavar="R",
        help="minibatches per size, a multiple of --workers (default 32)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=4,
        metavar="M",
        help="workers emulated by the estimators, each with its own b examples (default 4)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="output folder (default: <run>/analysis/gradients-round-NNNNNN-trainer-T)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the example and minibatch draws (default 0)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def open_checkpoint(path: Path) -> tuple[Path, Checkpoint]:
    """(run directory, verified checkpoint) for a run directory or a checkpoint folder."""
    from adloco.engine import checkpoint

    p = path.expanduser()
    if (p / checkpoint.STATE).is_file():
        run_dir = p.parent.parent if p.parent.name == checkpoint.DIR else p.parent
        ck = checkpoint.Checkpoint(p)
        problem = ck.verify()
        if problem is not None:
            raise UserError(problem)
        return run_dir, ck
    if not p.is_dir():
        raise UserError(f"--checkpoint {str(path)!r}: no such directory")
    found = checkpoint.complete(p, checkpoint.configured_dir(p))
    if not found:
        raise UserError(
            f"--checkpoint {str(path)!r}: neither a checkpoint folder (no {checkpoint.STATE}) nor a run "
            f"directory with a complete {checkpoint.DIR}/round-NNNNNN"
        )
    ck = checkpoint.Checkpoint(found[-1])
    problem = ck.verify()
    if problem is not None:
        raise UserError(problem)
    return p, ck


def trainers_in(ck: Checkpoint) -> list[int]:
    """The trainer ids whose θ the checkpoint holds, ascending."""
    return sorted(int(t) for t in ck.meta["algorithm"]["requests"])


def load_model(
    ck: Checkpoint, trainer: int, device: torch.device, log: Callable[[str], None]
) -> tuple[Config, Data, FlatModule]:
    """The checkpoint's config and data, and its trainer's θ in a model rebuilt from that config."""
    from adloco.data.tokens import prepare
    from adloco.library.flat import FlatModule
    from adloco.models import factory_for

    saved = ck.meta.get("config")
    if not isinstance(saved, dict):
        raise UserError(f"--checkpoint {str(ck.path)!r}: holds no config (not written by this adloco)")
    cfg = resolve(base=as_it_ran(saved))
    data = prepare(cfg.data, cfg.model.task, cfg.model.trust_remote_code, log=log)
    factory = factory_for(cfg.model, cfg.data.seq_len, data)
    flat = FlatModule(factory.build(cfg.algorithm.seed).to(device))
    theta = ck.tensor(f"trainer/{trainer}/theta")
    if theta is None or theta.numel() != flat.numel:
        have = "no theta" if theta is None else f"{theta.numel()} values"
        raise UserError(
            f"--checkpoint {str(ck.path)!r}: trainer {trainer} holds {have}; the model rebuilt "
            f"from its config has {flat.numel} parameters"
        )
    flat.param.copy_(theta)
    flat.module.eval()  # dropout off: a gradient is a function of its examples alone
    return cfg, data, flat


# --------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------


class Gradients:
    """Gradients of the mean loss at the model's fixed θ over any set of training examples."""

    def __init__(self, flat: FlatModule, fetch: Callable[[np.ndarray], Batch], micro: int) -> None:
        self.flat, self.fetch, self.micro = flat, fetch, micro
        self.device = flat.param.device

    def __call__(self, idx: np.ndarray) -> tuple[torch.Tensor, float]:
        """(a new (P,) float32 gradient, the mean loss) over the examples ``idx``, in micro-batches."""
        self.flat.zero_grad()
        n = len(idx)
        loss = 0.0
        for start in range(0, n, self.micro):
            part = idx[start : start + self.micro]
            batch = {k: v.to(self.device) for k, v in self.fetch(part).items()}
            out = self.flat.module(**batch).loss * (len(part) / n)
            out.backward()
            loss += float(out.detach())
        return self.flat.grad.clone(), loss


def _sq(x: torch.Tensor) -> float:
    return float(x.dot(x))


@dataclass(frozen=True)
class Estimate:
    """One estimator's reading on one group of M workers."""

    sigma2: float
    gbar_sq: float
    target: float  # norm-test T per worker

    @classmethod
    def of(cls, st: batching.TrainerStats | None, batch: AdaptiveBatch, request: int) -> Estimate:
        """``st``'s reading as training would take it for a request of ``request`` rows a worker."""
        if st is None:
            return cls(math.nan, math.nan, math.nan)
        rows = batch.noise_of(st.workers, request)
        return cls(st.sigma2, st.gbar_sq, replace(batch.rule, test="norm").target(st, rows))


@dataclass
class SizeResult:
    b: int
    theory: float  # σ²/b · (N − b)/N
    layout: tuple[int, int, bool]  # the pooled estimator's (k chunks, c examples each, extra probe batch)
    deviations: list[float] = field(default_factory=list)  # ‖g_B − G‖² per minibatch
    pooled: list[Estimate] = field(default_factory=list)
    paper: list[Estimate] = field(default_factory=list)

    @property
    def mean_deviation(self) -> float:
        return float(np.mean(self.deviations))


@dataclass
class Result:
    examples: int  # N
    workers: int  # M
    eta: float
    loss: float  # mean loss over the N examples
    grad_sq: float  # ‖G‖²
    sigma2: float  # Σ_i ‖g_i − G‖² / (N − 1)
    mean_gap: float  # ‖mean_i g_i − G‖ / ‖G‖: one backward per example against micro-batches
    per_example: list[float]  # ‖g_i − G‖²
    sizes: list[SizeResult]

    @property
    def true_target(self) -> float:
        """σ² / (M η² ‖G‖²): the norm test's per-worker target with exact statistics."""
        return self.sigma2 / (self.workers * self.eta**2 * self.grad_sq) if self.grad_sq > 0 else math.nan


def analyze(
    grads: Gradients,
    indices: np.ndarray,
    sizes: Sequence[int],
    repeats: int,
    workers: int,
    batch: AdaptiveBatch,
    rng: np.random.Generator,
    log: Callable[[str], None],
) -> Result:
    """Measure the population ``indices`` (dataset indices) and the estimators on it (see the module doc).

    Needs ``repeats`` a multiple of ``workers`` and, for every b, M·b (+ M·k probe examples) <= N.
    """
    N, M = len(indices), workers
    log(f"full gradient over {N} examples")
    G, loss = grads(indices)
    total = G.new_zeros(G.shape)
    per_example = []
    log(f"{N} per-example gradients")
    for i in range(N):
        g, _ = grads(indices[i : i + 1])
        total += g
        per_example.append(_sq(g - G))
    gap = _sq(total / N - G)
    # Σ_i ‖g_i − G‖² = Σ_i ‖g_i − ḡ‖² + N ‖ḡ − G‖²: σ² is the sample variance whatever the rounding of G.
    sigma2 = (sum(per_example) - N * gap) / (N - 1)
    grad_sq = _sq(G)
    shared = batching.needs_shared_mean("norm", "pooled", batch.exact_mean)
    results = []
    for b in sizes:
        k, c, extra = batching.probe_layout([b] * M, batch.probe_chunks)
        res = SizeResult(b, sigma2 / b * (N - b) / N, (k, c, extra))
        log(f"batch size {b}: {repeats} minibatches in groups of {M} workers")
        for _ in range(repeats // M):
            perm = rng.permutation(N)
            chunk_sum = G.new_zeros(G.shape)
            batch_sum = G.new_zeros(G.shape)
            pooled, paper = [], []
            for m in range(M):
                rows = indices[perm[m * b : (m + 1) * b]]
                probe = indices[perm[M * b + m * k : M * b + (m + 1) * k]] if extra else rows[: k * c]
                own = G.new_zeros(G.shape)
                sum_sq = 0.0
                for j in range(k):
                    g, _ = grads(probe[j * c : (j + 1) * c])
                    own += g
                    sum_sq += _sq(g)
                pooled.append(batching.WorkerStats(k, c, sum_sq, _sq(own / k)))
                chunk_sum += own
                if extra:
                    g_b, _ = grads(rows)
                elif b > k * c:  # rows left out of the chunks
                    rest, _ = grads(rows[k * c :])
                    g_b = (own * c + rest * (b - k * c)) / b
                else:
                    g_b = own * (c / b)
                sq = _sq(g_b)
                paper.append(batching.WorkerStats(1, b, sq, sq))
                batch_sum += g_b
                res.deviations.append(_sq(g_b - G))
            gbar_sq = _sq(chunk_sum / (M * k)) if shared else None
            res.pooled.append(Estimate.of(batching.pool(pooled, gbar_sq), batch, b))
            res.paper.append(Estimate.of(batching.pool(paper, _sq(batch_sum / M)), batch, b))
        results.append(res)
    return Result(
        examples=N,
        workers=M,
        eta=batch.eta,
        loss=loss,
        grad_sq=grad_sq,
        sigma2=sigma2,
        mean_gap=math.sqrt(gap / grad_sq) if grad_sq > 0 else 0.0,
        per_example=per_example,
        sizes=results,
    )


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def _mean(xs: Sequence[float]) -> float:
    ok = [x for x in xs if math.isfinite(x)]
    return float(np.mean(ok)) if ok else math.nan


def _median(xs: Sequence[float]) -> float:
    ok = [x for x in xs if math.isfinite(x)]
    return float(np.median(ok)) if ok else math.nan


def _finite(x: Any) -> Any:
    """JSON has no NaN or infinity: null instead."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def summary(r: Result) -> list[dict[str, float]]:
    """One row per batch size: deviations against theory, the estimators' means (T: median)."""
    rows = []
    for s in r.sizes:
        row = {"b": s.b, "mean_deviation": s.mean_deviation, "theory": s.theory}
        row["ratio"] = row["mean_deviation"] / s.theory if s.theory > 0 else math.nan
        for name, est in (("pooled", s.pooled), ("paper", s.paper)):
            row[f"{name}_sigma2"] = _mean([e.sigma2 for e in est])
            row[f"{name}_gbar_sq"] = _mean([e.gbar_sq for e in est])
            row[f"{name}_target"] = _median([e.target for e in est])
        rows.append(row)
    return rows


def _e(x: float) -> str:
    return f"{x:.3e}" if math.isfinite(x) else "-"


def _f(x: float) -> str:
    return f"{x:.1f}" if math.isfinite(x) else "-"


COLUMNS = [
    ("b", "b"),
    ("mean_deviation", "mean ‖g_B−G‖²"),
    ("theory", "σ²/b·(N−b)/N"),
    ("ratio", "ratio"),
    ("pooled_sigma2", "pooled σ̂²"),
    ("pooled_gbar_sq", "pooled ‖ḡ‖²"),
    ("pooled_target", "pooled T"),
    ("paper_sigma2", "paper σ̂²"),
    ("paper_gbar_sq", "paper ‖ḡ‖²"),
    ("paper_target", "paper T"),
]


def _cells(row: dict[str, float]) -> list[str]:
    fmt: dict[str, Callable[[float], str]] = {
        "b": lambda x: str(int(x)),
        "ratio": lambda x: f"{x:.2f}",
        "pooled_target": _f,
        "paper_target": _f,
    }
    return [fmt.get(key, _e)(row[key]) for key, _ in COLUMNS]


def headline(r: Result, where: str) -> list[str]:
    return [
        f"{where}: N = {r.examples} examples, mean loss {r.loss:.4f}",
        f"‖G‖² = {_e(r.grad_sq)}, per-example variance σ² = {_e(r.sigma2)} (N − 1); "
        f"mean of per-example gradients vs G: {r.mean_gap:.1e} relative",
        f"norm test (η = {r.eta}, M = {r.workers} workers): true T = σ²/(M η² ‖G‖²) = {_f(r.true_target)}; "
        f"estimators: σ̂² and ‖ḡ‖² mean, T median over {len(r.sizes[0].paper) if r.sizes else 0} groups",
    ]


def table(r: Result, where: str) -> str:
    """The stdout report: a headline and one aligned row per batch size."""
    rows = [[h for _, h in COLUMNS]] + [_cells(row) for row in summary(r)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = headline(r, where) + [""]
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)


def markdown(r: Result, where: str) -> str:
    rows = summary(r)
    lines = ["# Gradient analysis", "", *[f"- {x}" for x in headline(r, where)], ""]
    lines.append("| " + " | ".join(h for _, h in COLUMNS) + " |")
    lines.append("|" + "---:|" * len(COLUMNS))
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    lines += [
        "",
        "pooled: the engine's chunk-gradient probe (ALGORITHM.md §2.5); paper: one gradient of b examples per worker, "
        "here at a common θ (no drift). T: the norm test's per-worker target (ALGORITHM.md §2.1).",
        "",
        "![deviations](deviations.png)",
        "",
        "![variance against batch size](variance_vs_batch.png)",
        "",
    ]
    return "\n".join(lines)


def plot(r: Result, out: Path) -> None:
    """``deviations.png`` (one histogram panel per b) and ``variance_vs_batch.png`` (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(r.sizes)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, s in zip(axes.flat, r.sizes, strict=False):
        ax.hist(s.deviations, bins=20, color="tab:blue", alpha=0.7)
        ax.axvline(s.mean_deviation, color="black", label="mean")
        ax.axvline(s.theory, color="tab:red", linestyle="--", label="σ²/b·(N−b)/N")
        ax.set(title=f"b = {s.b}", xlabel="‖g_B − G‖²")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"Minibatch gradient deviations (N = {r.examples})")
    fig.tight_layout()
    fig.savefig(out / "deviations.png", dpi=110)
    plt.close(fig)

    b = np.array([s.b for s in r.sizes], dtype=float)
    mean = np.array([s.mean_deviation for s in r.sizes])
    err = np.array([np.std(s.deviations) / math.sqrt(len(s.deviations)) for s in r.sizes])
    line = np.geomspace(b.min(), b.max(), 100)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(b, mean, yerr=err, fmt="o", capsize=3, label="mean ‖g_B − G‖² (± s.e.)")
    ax.plot(line, r.sigma2 / line, color="tab:red", label="σ²/b")
    theory = r.sigma2 / line * (r.examples - line) / r.examples
    ax.plot(line, theory, color="tab:red", linestyle="--", label="σ²/b·(N−b)/N")
    ax.set(xscale="log", yscale="log", xlabel="batch size b", ylabel="‖g_B − G‖²")
    ax.set_title("Minibatch gradient variance against batch size")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out / "variance_vs_batch.png", dpi=110)
    plt.close(fig)


def write(r: Result, info: dict[str, Any], out: Path, where: str) -> None:
    """gradients.json, report.md and the two plots into ``out``."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        doc = {
            **info,
            **{k: v for k, v in asdict(r).items() if k != "sizes"},
            "true_target": r.true_target,
            "summary": summary(r),
            "sizes": [asdict(s) for s in r.sizes],
        }
        (out / "gradients.json").write_text(json.dumps(_finite(doc), indent=1, allow_nan=False) + "\n")
        (out / "report.md").write_text(markdown(r, where), encoding="utf-8")
        plot(r, out)
    except OSError as exc:
        raise UserError(f"--out {str(out)!r}: cannot be written ({exc.strerror or exc})") from None


# --------------------------------------------------------------------------------------------------
# Command
# --------------------------------------------------------------------------------------------------


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in str(text).split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise UserError(f"--batch-sizes {text!r}: must be a comma-separated list of integers >= 1")
    return sorted(set(sizes))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """``adloco analyze-gradients``: measure, write the outputs, print the table. Returns 0."""
    import torch

    sizes = _sizes(args.batch_sizes)
    M, R, N = args.workers, args.repeats, args.examples
    if M < 2:
        raise UserError(f"--workers {M}: must be >= 2 (the paper estimator needs two workers)")
    if R < M or R % M:
        raise UserError(f"--repeats {R}: must be a positive multiple of --workers ({M})")
    if N < 2:
        raise UserError(f"--examples {N}: must be >= 2")
    run_dir, ck = open_checkpoint(Path(args.checkpoint))
    ids = trainers_in(ck)
    if not ids:
        raise UserError(f"--checkpoint {str(ck.path)!r}: holds no trainer-<t>.safetensors")
    trainer = ids[0] if args.trainer is None else args.trainer
    if trainer not in ids:
        raise UserError(f"--trainer {trainer}: not in {ck.path.name} (trainers: {', '.join(map(str, ids))})")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg, data, flat = load_model(ck, trainer, device, _stderr)
    if cfg.runtime.threads:
        torch.set_num_threads(cfg.runtime.threads)
    subset = trainer_subset(data.n_train, cfg.data.subset_fraction, cfg.algorithm.seed, trainer)
    if len(subset) < N:
        raise UserError(
            f"--examples {N}: at most {len(subset)} (the training examples trainer {trainer} draws from)"
        )
    k = cfg.batch.probe_chunks
    for b in sizes:
        need = M * (b + (k if b < 2 else 0))
        if need > N:
            raise UserError(
                f"--batch-sizes {b}: {M} workers need {need} distinct examples; raise --examples to {need}"
            )
    rng = np.random.default_rng(args.seed)
    indices = np.sort(rng.choice(subset, size=N, replace=False))
    grads = Gradients(flat, data.train_batch, cfg.switch.b_max or 8)
    result = analyze(grads, indices, sizes, R, M, cfg.batch, rng, _stderr)
    out = Path(args.out) if args.out else run_dir / "analysis" / f"gradients-{ck.path.name}-trainer-{trainer}"
    request = ck.meta.get("trainers", {}).get(str(trainer), {}).get("request")
    where = (
        f"{ck.path.name}, trainer {trainer} (request {request}), {cfg.model.name} ({flat.numel} parameters)"
    )
    info = {
        "checkpoint": str(ck.path),
        "round": ck.round,
        "trainer": trainer,
        "request": request,
        "model": cfg.model.name,
        "parameters": flat.numel,
        "device": device.type,
        "seed": args.seed,
        "probe_chunks": k,
        "indices": indices.tolist(),
    }
    write(result, info, out, where)
    print(table(result, where))
    print(f"outputs: {out}")
    return 0
