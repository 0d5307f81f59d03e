"""Comparison of run directories: plots and a markdown report, from the run directories alone.

Used by ``adloco bench`` after its runs and by ``adloco report RUN_DIR…``. Every number comes from a
run's ``metrics.jsonl``, ``summary.json`` and ``config.yaml``; simulated time is recomputed from the
logged per-worker compute times and collectives with the network model (spec §7), so it can be priced
for another network without re-running anything.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from adloco import netmodel
from adloco.errors import UserError
from adloco.telemetry.metrics import read_jsonl


@dataclass
class Run:
    path: Path
    label: str
    config: dict[str, Any]
    summary: dict[str, Any]
    events: list[dict[str, Any]]
    bandwidth: float = 125e6  # the network simulated time was priced on
    latency: float = 1e-3
    # one point per evaluation: (round, examples, communications, bytes, simulated s, validation ppl)
    points: list[tuple[int, int, int, int, float, float]] = field(default_factory=list)

    @property
    def method(self) -> str:
        return str(self.config.get("algorithm", {}).get("method", "?"))


def load(path: Path, bandwidth: float | None = None, latency: float | None = None) -> Run:
    """Read one run directory (one line of error if it is not a finished run)."""
    where = f"run directory {str(path)!r}"
    for name in ("config.yaml", "metrics.jsonl"):
        if not (path / name).is_file():
            raise UserError(f"{where}: no {name} (not a run directory)")
    config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8")) or {}
    events = read_jsonl(path / "metrics.jsonl")
    summary = {}
    if (path / "summary.json").is_file():
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    label = config.get("logging", {}).get("name") or config.get("algorithm", {}).get("method") or path.name
    run = Run(path, str(label), config, summary, events)
    net = config.get("network", {})
    bw = bandwidth or float(net.get("bandwidth", 125e6))
    lat = latency if latency is not None else float(net.get("latency", 1e-3))
    run.bandwidth, run.latency = bw, lat
    speeds = config.get("runtime", {}).get("worker_speeds") or []
    start = next((e for e in events if e["event"] == "start"), None)
    if start is None or start.get("val_ppl") is None:
        raise UserError(
            f"{where}: no start event with a validation perplexity (a language-model run is needed)"
        )
    compute: dict[int, dict[int, float]] = {}
    for e in events:
        if e["event"] == "worker":
            compute.setdefault(e["round"], {})[e["worker"]] = e["compute_s"]
    sim = 0.0
    run.points.append((0, 0, 0, 0, 0.0, float(start["val_ppl"])))
    for e in events:
        if e["event"] != "round":
            continue
        sim += netmodel.round_seconds(compute.get(e["round"], {}), e.get("collectives", []), bw, lat, speeds)
        ppl = e.get("val_ppl")
        if ppl is not None:
            run.points.append(
                (
                    e["round"],
                    e["examples_total"],
                    e["communications_total"],
                    e["bytes_total"],
                    sim,
                    float(ppl),
                )
            )
    return run


def reach(run: Run, target: float) -> dict[str, float] | None:
    """Examples, communications, bytes and simulated seconds at the first evaluation at or below target."""
    for r, ex, comms, nbytes, sim, ppl in run.points:
        if ppl <= target:
            return {"round": r, "examples": ex, "communications": comms, "bytes": nbytes, "sim_s": sim}
    return None


def theorem1(run: Run) -> list[tuple[int, int, float, int]]:
    """(round, trainer, Theorem 1 lower bound on the next request, the next request) per trainer event.

    Reconstructed statement (spec §8): E[b_{k+1}] ≥ σ²/(M η² (‖∇F‖² + σ²/(M b_k))), with the logged
    estimates of σ² and ‖ḡ‖² for ‖∇F‖², M the trainer's workers and η from the config.
    """
    eta = float(run.config.get("batch", {}).get("eta", 0.65))
    out = []
    for e in run.events:
        if e["event"] != "trainer" or e.get("sigma2") is None or e.get("gbar_sq") is None:
            continue
        m, b, s2, g2 = len(e["workers"]), e["request"], e["sigma2"], e["gbar_sq"]
        bound = s2 / (m * eta**2 * (g2 + s2 / (m * b)))
        out.append((e["round"], e["trainer"], bound, e["request_next"]))
    return out


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n}"


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def write(runs: list[Run], out: Path, target: float | None = None, command: str | None = None) -> Path:
    """Draw the comparison plots into ``out/plots`` and write ``out/report.md``; returns the report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    out.mkdir(parents=True, exist_ok=True)
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    finals = [r.points[-1][5] for r in runs if r.points]
    if target is None:
        target = max(finals)
    drawn: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(plots / name, dpi=110)
        plt.close(fig)
        drawn.append(name)

    axes_spec = [
        ("examples", 1, "training examples processed", "val_ppl_vs_examples.png"),
        ("communications", 2, "outer communications (messages)", "val_ppl_vs_communications.png"),
        ("bytes", 3, "bytes communicated (all workers)", "val_ppl_vs_bytes.png"),
        ("simulated time", 4, "simulated wall time (s)", "val_ppl_vs_simulated_time.png"),
    ]
    for what, i, xlabel, name in axes_spec:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for r in runs:
            xs = [p[i] for p in r.points]
            ax.plot(xs, [p[5] for p in r.points], marker="o", markersize=3, label=r.label)
        ax.axhline(target, color="grey", linestyle=":", linewidth=1, label=f"target {target:.1f}")
        if what in ("bytes", "communications"):
            ax.set_xscale("symlog" if what == "communications" else "log")
        ax.set(
            xlabel=xlabel, ylabel="validation perplexity", yscale="log", title=f"Perplexity against {what}"
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, name)

    def per_run(name: str, title: str, draw: Any) -> None:
        n = len(runs)
        cols = min(n, 4)
        rows = math.ceil(n / cols)
        fig, axs = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False)
        for k, r in enumerate(runs):
            ax = axs[k // cols][k % cols]
            draw(ax, r)
            ax.set_title(r.label, fontsize=9)
            ax.grid(alpha=0.3)
        for k in range(n, rows * cols):
            axs[k // cols][k % cols].axis("off")
        fig.suptitle(title)
        save(fig, name)

    def requests(ax: Any, r: Run) -> None:
        by: dict[int, list[tuple[int, int]]] = {}
        for e in r.events:
            if e["event"] == "trainer":
                by.setdefault(e["trainer"], []).append((e["round"], e["request"]))
        for t, pts in sorted(by.items()):
            ax.plot(*zip(*pts, strict=True), marker=".", label=f"t{t}")
        bound = theorem1(r)
        if bound:
            ax.plot(
                [b[0] + 1 for b in bound],
                [b[2] for b in bound],
                "k.",
                markersize=3,
                label="Thm 1 bound (reconstructed)",
            )
        ax.set(xlabel="round", ylabel="request b", yscale="log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.legend(fontsize=6)

    per_run("requests.png", "Request per trainer per round", requests)

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for r in runs:
        pts = [(0, r.config.get("algorithm", {}).get("trainers", 1))]
        pts += [(e["round"], e["trainers_alive"]) for e in r.events if e["event"] == "round"]
        ax.step(*zip(*pts, strict=True), where="post", label=r.label)
    ax.set(xlabel="round", ylabel="trainers alive", title="Trainers alive")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, "trainers_alive.png")

    def alloc(ax: Any, r: Run) -> None:
        rounds = [e for e in r.events if e["event"] == "round"]
        if not rounds:
            return
        workers = sorted(int(w) for w in rounds[0]["allocation"])
        grid = [[e["allocation"][str(w)] for e in rounds] for w in workers]
        ax.imshow(
            grid,
            aspect="auto",
            cmap="tab10",
            vmin=0,
            vmax=9,
            interpolation="nearest",
            extent=(0.5, len(rounds) + 0.5, len(workers) - 0.5, -0.5),
        )
        ax.set(xlabel="round", ylabel="worker (colour: trainer)")

    per_run("allocation.png", "Worker allocation (colour = trainer)", alloc)

    def batch(ax: Any, r: Run) -> None:
        eff: dict[int, list[int]] = {}
        acc: dict[int, list[int]] = {}
        for e in r.events:
            if e["event"] == "worker":
                eff.setdefault(e["round"], []).append(e["effective"])
                acc.setdefault(e["round"], []).append(e["accum"])
        xs = sorted(eff)
        ax.plot(xs, [sum(eff[x]) / len(eff[x]) for x in xs], marker=".", label="effective batch (mean)")
        ax.plot(xs, [max(acc[x]) for x in xs], marker=".", label="accumulation (max)")
        ax.set(xlabel="round", yscale="log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.legend(fontsize=6)

    per_run("batch.png", "Effective batch and gradient accumulation per worker", batch)

    # the table
    lines = [
        "# adloco comparison",
        "",
    ]
    if command:
        lines += ["Made by:", "", "```bash", command, "```", ""]
    nets = {(r.bandwidth, r.latency) for r in runs}
    bw, lat = runs[0].bandwidth, runs[0].latency
    network = (
        f"{bw / 1e6:g} MB/s and {lat * 1e3:g} ms latency"
        if len(nets) == 1
        else "each run's own network (`network` in its config.yaml)"
    )
    lines += [
        f"Target perplexity: **{target:.2f}** (the highest final perplexity among the runs unless given). "
        f"Simulated time: the slowest worker's measured compute per round (scaled by `runtime.worker_speeds`) "
        f"plus every counted collective on {network} (ring all-reduce 2(n−1)/n·B/bandwidth + "
        "2(n−1)·latency; spec §7). Peak memory: the process's resident set on CPU, CUDA allocations on a GPU.",
        "",
        "| run | method | rounds | final ppl | examples → target | comms → target | bytes → target "
        "| sim. time → target | examples | bytes | sim. time | peak memory | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        got = reach(r, target)
        s = r.summary
        last = r.points[-1]
        lines.append(
            f"| {r.label} | {r.method} | {last[0]} | {last[5]:.2f} | "
            + (
                f"{got['examples']:,} | {got['communications']:,} | {_fmt_bytes(got['bytes'])} | {got['sim_s']:.1f} s"
                if got
                else "not reached | — | — | —"
            )
            + f" | {last[1]:,} | {_fmt_bytes(last[3])} | {last[4]:.1f} s | "
            + f"{_fmt_bytes(s['peak_memory_bytes']) if s.get('peak_memory_bytes') else '—'} | "
            + f"{_fmt(s.get('wall_s'))} s |"
        )
    lines += ["", "Plots:", ""] + [f"![{n}](plots/{n})" for n in drawn] + [""]
    bound_runs = [r for r in runs if theorem1(r)]
    if bound_runs:
        lines += [
            "The black dots on the request plots are the Theorem 1 lower bound (spec §8), computed from the "
            "logged estimates of σ² and ‖ḡ‖²: a reconstructed statement with unverified constants, drawn "
            "as a sanity check of the batch trajectories, not as the paper's numbers.",
            "",
        ]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report
