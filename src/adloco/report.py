"""Plots from a run directory's metrics.jsonl, drawn after training (never inside the loop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adloco.telemetry.metrics import read_jsonl


def _series(events: list[dict[str, Any]]) -> dict[str, Any]:
    start = next((e for e in events if e.get("event") == "start"), None)
    rounds = [e for e in events if e.get("event") == "round"]
    key = "val_accuracy" if start and start.get("task") == "classification" else "val_ppl"
    ppl = [(0, 0, start[key])] if start and start.get(key) is not None else []
    ppl += [(e["round"], e["bytes_total"], e[key]) for e in rounds if e.get(key) is not None]
    requests: dict[int, list[tuple[int, int]]] = {}
    for e in events:
        if e.get("event") == "trainer":
            requests.setdefault(e["trainer"], []).append((e["round"], e["request"]))
    alive = [(0, start["trainers"])] if start else []
    alive += [(e["round"], e["trainers_alive"]) for e in rounds]
    return {"ppl": ppl, "requests": requests, "alive": alive, "metric": key}


def plot_run(run_dir: Path) -> list[Path]:
    """Write the run's PNG plots into ``run_dir/plots`` and return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = _series(read_jsonl(run_dir / "metrics.jsonl"))
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    paths = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)

    if s["ppl"]:
        r, b, p = zip(*s["ppl"], strict=True)
        acc = s["metric"] == "val_accuracy"
        label, scale = ("validation accuracy", "linear") if acc else ("validation perplexity", "log")
        short = "val_accuracy" if acc else "val_ppl"
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(r, p, marker="o")
        ax.set(xlabel="round", ylabel=label, yscale=scale, title=label.capitalize())
        ax.grid(alpha=0.3)
        save(fig, f"{short}_vs_round.png")
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([x / 1e6 for x in b], p, marker="o")
        ax.set(
            xlabel="MB communicated (all workers)",
            ylabel=label,
            yscale=scale,
            title=f"{label.split()[1].capitalize()} against communication",
        )
        ax.grid(alpha=0.3)
        save(fig, f"{short}_vs_bytes.png")
    if s["requests"]:
        fig, ax = plt.subplots(figsize=(6, 4))
        for t, pts in sorted(s["requests"].items()):
            r, b = zip(*pts, strict=True)
            ax.plot(r, b, marker="o", label=f"trainer {t}")
        ax.set(xlabel="round", ylabel="request b (per-worker batch)", title="Requests per trainer")
        ax.legend()
        ax.grid(alpha=0.3)
        save(fig, "requests.png")
    if s["alive"]:
        r, k = zip(*s["alive"], strict=True)
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.step(r, k, where="post", marker="o")
        ax.set(xlabel="round", ylabel="trainers alive", title="Trainers alive", ylim=(0, max(k) + 0.5))
        ax.grid(alpha=0.3)
        save(fig, "trainers_alive.png")
    return paths
