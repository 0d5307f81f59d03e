"""Does AdLoCo pay as models grow? AdLoCo's final perplexity and simulated time to the target over
DiLoCo's (and over DiLoCo with a batch schedule, where the bench ran it), per seed, against model size,
one line per corpus, from finished `adloco bench` folders (configs/scale-*.yaml; benchmarks/RESULTS.md).

Each folder's model and corpus are read from its runs' config.yaml, its parameter count from the model's
shape (adloco.models.sizing) and its target from its results.json (re-target a bench with
`adloco bench --report-only ... --target T --out NEW` first). Prints a Markdown table and, with
--plot, draws the two ratios against parameters (mean over the seeds, min–max bars; below the dashed
line AdLoCo is lower or sooner).

Usage:  python benchmarks/scaling.py BENCH_DIR [BENCH_DIR ...] [--plot benchmarks/plots/scaling.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import claims  # noqa: E402

from adloco.models.sizing import SHAPES, llama_parameters  # noqa: E402

RIVALS = (("diloco", "DiLoCo"), ("diloco-schedule", "DiLoCo with a batch schedule"))
FIGURES = (("final", "final perplexity"), ("to_target.sim_s", "simulated time to the target"))


def point(folder: Path) -> dict[str, Any]:
    """One bench: its model, corpus, parameters, target and AdLoCo's ratios to each rival it ran."""
    try:
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
        run = next(e for e in results["variants"]["adloco"]["runs"] if e.get("folder"))
        config = yaml.safe_load((folder / run["folder"] / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, StopIteration) as exc:
        raise SystemExit(
            f"scaling: {folder}: not a finished adloco bench with an adloco run ({exc})"
        ) from None
    model, data = config["model"]["name"], config["data"]
    vocab = int(str(data.get("tokenizer", "bpe:4096")).removeprefix("bpe:"))
    out: dict[str, Any] = {
        "folder": str(folder),
        "model": model,
        "corpus": str(data["source"]),
        "parameters": llama_parameters(SHAPES[model], vocab),
        "target": results.get("target"),
        "seeds": len(results["variants"]["adloco"]["runs"]),
    }
    for rival, _ in RIVALS:
        for key, _ in FIGURES:
            out[(rival, key)] = claims.ratios(results, "adloco", rival, key)
    return out


def table(points: list[dict[str, Any]]) -> str:
    head = [f"AdLoCo / {name}: {what}" for rival, name in RIVALS for _, what in FIGURES]
    lines = [
        "| corpus | model | parameters | target | seeds | " + " | ".join(head) + " |",
        "|---|---|---|---|---|" + "---|" * len(head),
    ]
    for p in sorted(points, key=lambda p: (p["corpus"], p["parameters"])):
        cells = [claims.shown(p[(rival, key)]) for rival, _ in RIVALS for key, _ in FIGURES]
        target = "—" if p["target"] is None else f"{p['target']:.0f}"
        lines.append(
            f"| {p['corpus']} | {p['model']} | {p['parameters'] / 1e6:.1f} M | {target} | {p['seeds']} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    corpora = sorted({p["corpus"] for p in points})
    colours = dict(zip(corpora, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for ax, (key, what) in zip(axes, FIGURES, strict=True):
        for corpus in corpora:
            mine = sorted((p for p in points if p["corpus"] == corpus), key=lambda p: p["parameters"])
            for (rival, name), style in zip(RIVALS, ("-o", "--s"), strict=True):
                xs, ys, lo, hi = [], [], [], []
                for p in mine:
                    rs = p[(rival, key)]
                    if rs:
                        m = statistics.fmean(rs)
                        xs.append(p["parameters"])
                        ys.append(m)
                        lo.append(m - min(rs))
                        hi.append(max(rs) - m)
                if xs:
                    ax.errorbar(
                        xs,
                        ys,
                        yerr=[lo, hi],
                        fmt=style,
                        color=colours[corpus],
                        capsize=3,
                        label=f"{corpus}: over {name}",
                    )
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        sizes = sorted({p["parameters"] for p in points})  # a tick at each size measured, named by it
        ax.set_xticks(sizes, [f"{n / 1e6:.3g}M" for n in sizes])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("model parameters")
        ax.set_ylabel("AdLoCo / rival (below 1: AdLoCo lower or sooner)")
        ax.set_title(f"{what[0].upper()}{what[1:]}" + (" (the bench's link)" if key != "final" else ""))
    axes[0].legend(fontsize=8)
    fig.suptitle("AdLoCo against DiLoCo (tuned for time) and DiLoCo with a batch schedule, by model size")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("benches", type=Path, nargs="+", help="folders of finished adloco benches")
    ap.add_argument("--plot", type=Path, help="draw the ratios against model size into this PNG")
    args = ap.parse_args()
    points = [point(f) for f in args.benches]
    print(table(points))
    if args.plot:
        plot(points, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
