"""``adloco simulate`` calibrated and at scale: the tables and plots of benchmarks/RESULTS.md, "Planning a
run", and of docs/guides/planning.md.

    python benchmarks/simulate.py                       # seconds of CPU; plots into benchmarks/plots (simulate-*.png)

Prints markdown tables: the published calibration points against the simulator, the utilization at N = 8
to 1,024, goodput against the failure rate under restart and live recovery, and what H, codec and
overlap reach 90% utilization at 100 Mbit/s and 1 Gbit/s for 1B, 10B and 70B models.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from adloco import netmodel  # noqa: E402
from adloco.library.settings import Sync, Wire  # noqa: E402
from adloco.plan import calibration  # noqa: E402
from adloco.plan.sim import Device, Failures, Setup, price  # noqa: E402

MBIT = 1e6 / 8


def calibration_table() -> None:
    print("| source | published | simulated | within |")
    print("|---|---|---|---|")
    for r in calibration.table6():
        name = {"dp": "data parallel", "h100": "DiLoCo H=100", "h300": "DiLoCo H=300"}[r["method"]]
        print(
            f"| 2503.09799 Table 6, {name}: Gbit/s for 80% | {r['published']:.3g} | {r['gbits']:.3g} "
            f"(grid {r['grid']:.3g}) | {100 * (r['gbits'] / r['published'] - 1):+.0f}% |"
        )
    by = {r["method"]: r for r in calibration.table6()}
    ratio = by["dp"]["gbits"] / by["h100"]["gbits"]
    print(
        f"| Table 6, data parallel ÷ DiLoCo H=100 | {184.2 / 6.25:.1f} | {ratio:.1f} | {100 * (ratio / (184.2 / 6.25) - 1):+.0f}% |"
    )
    ratio = by["h100"]["gbits"] / by["h300"]["gbits"]
    print(
        f"| Table 6, DiLoCo H=100 ÷ H=300 | {6.25 / 2.02:.2f} | {ratio:.2f} | {100 * (ratio / (6.25 / 2.02) - 1):+.0f}% |"
    )
    cov = calibration.covenant()
    print(
        f"| 2603.08163 Covenant-72B: communication a round | ~70 s | {cov['comm_s']:.0f} s (one upload alone "
        f"{cov['upload_s']:.0f} s) | not reproduced |"
    )
    print(f"| Covenant-72B: utilization | 94.5% | {100 * cov['utilization']:.1f}% | not reproduced |")
    it = calibration.intellect()
    print(
        f"| 2412.01152 INTELLECT-1: utilization (38 min against 8.3) | 82% | {100 * it['utilization']:.1f}% at "
        f"{it['mbits']:.0f} Mbit/s a link | bandwidth not published |"
    )
    pt = calibration.torchft_point()
    print(
        f"| torchft: step efficiency, a failure every {pt['seconds_between_failures']:.0f} s over {pt['groups']} groups | {100 * pt['efficiency']:.1f}% | see below | step time not published |"
    )


def at_scale(out: Path) -> None:
    print("\n| N | DiLoCo int4 H=100, 1 Gbit/s: round | utilization | bytes a round | seconds of CPU |")
    print("|---|---|---|---|---|")
    base = Setup(
        "diloco",
        8,
        10_000_000_000,
        Device.of_step(0.8),
        netmodel.Link(1000 * MBIT, 0.01),
        100,
        wire=Wire("int4"),
    )
    ns = [8, 16, 32, 64, 128, 256, 512, 1024]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, s in [
        ("DiLoCo float32", replace(base, wire=Wire())),
        ("DiLoCo int4", base),
        ("DiLoCo topk (all-gather)", replace(base, wire=Wire("topk"))),
        (
            "DiLoCo int4, 2 sites, 100 Mbit/s between",
            replace(
                base,
                net=netmodel.Network(
                    1000 * MBIT, 0.001, sites=(4, 4), site_bandwidth=100 * MBIT, site_latency=0.05
                ),
            ),
        ),
    ]:
        us = []
        for n in ns:
            net = s.net
            if isinstance(net, netmodel.Network):
                net = replace(net, sites=(n // 2, n - n // 2))
            t0 = time.process_time()
            r = price(replace(s, workers=n, net=net), range(n))
            cpu = time.process_time() - t0
            us.append(100 * r.utilization)
            if label == "DiLoCo int4":
                print(
                    f"| {n} | {r.seconds:.0f} s | {100 * r.utilization:.1f}% | {r.bytes / 1e9:.0f} GB | {cpu:.3f} |"
                )
        ax.plot(ns, us, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("workers N")
    ax.set_ylabel("compute utilization, %")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("10B, 0.8 s a step, H = 100, links of 1 Gbit/s and 10 ms")
    fig.savefig(out / "simulate-utilization-against-workers.png", dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    mbits = [10, 30, 100, 300, 1000, 3000, 10000]
    s = replace(base, workers=64)
    for label, w, sync in [
        ("float32", Wire(), Sync()),
        ("int8", Wire("int8"), Sync()),
        ("int4", Wire("int4"), Sync()),
        ("topk", Wire("topk"), Sync()),
        ("int4, delayed overlap", Wire("int4"), Sync(overlap="delayed")),
    ]:
        us = [
            100
            * price(replace(s, wire=w, sync=sync, net=netmodel.Link(m * MBIT, 0.01)), range(64)).utilization
            for m in mbits
        ]
        ax.plot(mbits, us, marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("each worker's link, Mbit/s")
    ax.set_ylabel("compute utilization, %")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("DiLoCo, 64 workers, 10B, 0.8 s a step, H = 100")
    fig.savefig(out / "simulate-utilization-against-bandwidth.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def failures(out: Path) -> None:
    print("\n| a failure every (whole run) | restart recovery goodput | live recovery goodput |")
    print("|---|---|---|")
    n = 64
    s = Setup(
        "diloco",
        n,
        10_000_000_000,
        Device.of_step(0.8),
        netmodel.Link(1000 * MBIT, 0.01),
        100,
        wire=Wire("int4"),
        rounds=300,
        failures=Failures(restart_s=10.5),
    )
    every = [30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 4 * 3600.0]
    rows = {rec: calibration.recovery_curve([e * n for e in every], s, rec) for rec in ("restart", "live")}
    for i, e in enumerate(every):
        print(
            f"| {e:.0f} s | {100 * rows['restart'][i]['goodput']:.1f}% | {100 * rows['live'][i]['goodput']:.1f}% |"
        )
    ddp = Setup(
        "ddp",
        30,
        1_000_000_000,
        Device.of_step(1.0),
        netmodel.Link(1e11, 1e-4),
        1,
        rounds=3000,
        failures=Failures(restart_s=10.5),
    )
    ddp_rows = {
        rec: calibration.recovery_curve([e * 30 for e in every], ddp, rec) for rec in ("restart", "live")
    }
    print(
        "\n| a failure every (30 DDP groups, 1 s steps) | restart recovery goodput | live recovery goodput |"
    )
    print("|---|---|---|")
    for i, e in enumerate(every):
        print(
            f"| {e:.0f} s | {100 * ddp_rows['restart'][i]['goodput']:.1f}% | {100 * ddp_rows['live'][i]['goodput']:.1f}% |"
        )
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for rec, style in (("restart", "o-"), ("live", "s-")):
        ax.plot(
            every,
            [100 * r["goodput"] for r in rows[rec]],
            style,
            label=f"{rec} recovery, DiLoCo int4, 64 workers, 10B",
        )
        ax.plot(
            every,
            [100 * r["goodput"] for r in ddp_rows[rec]],
            style,
            alpha=0.5,
            label=f"{rec} recovery, DDP, 30 groups, 1 s steps",
        )
    pt = calibration.torchft_point()
    ax.plot(
        [pt["seconds_between_failures"]],
        [100 * pt["efficiency"]],
        "k*",
        markersize=12,
        label="torchft (published)",
    )
    ax.set_xscale("log")
    ax.set_xlabel("seconds between failures, whole run")
    ax.set_ylabel("goodput, %")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("restart every process (10.5 s) against live recovery")
    fig.savefig(out / "simulate-goodput-against-failures.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def needs() -> None:
    print("\n| model | link | float32 | int8 | int4 | int4 + delayed overlap | topk |")
    print("|---|---|---|---|---|---|---|")
    Hs = [1, 10, 30, 100, 300, 1000, 3000]
    for name, P, step in (("1B", 1e9, 0.1), ("10B", 1e10, 0.8), ("70B", 7e10, 4.9)):
        for mb in (100, 1000):
            cells = []
            delayed = Sync(overlap="delayed")
            for w, sync in (
                (Wire(), Sync()),
                (Wire("int8"), Sync()),
                (Wire("int4"), Sync()),
                (Wire("int4"), delayed),
                (Wire("topk"), Sync()),
            ):
                link = netmodel.Link(mb * MBIT, 0.01)
                s = Setup("diloco", 64, int(P), Device.of_step(step), link, 1, wire=w, sync=sync)
                got = next(
                    (h for h in Hs if price(replace(s, inner_steps=h), range(64)).utilization >= 0.9), None
                )
                cells.append(f"H ≥ {got}" if got else "> 3000")
            print(f"| {name} ({step} s a step) | {mb} Mbit/s | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plots", default="benchmarks/plots")
    args = p.parse_args()
    out = Path(args.plots)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.process_time()
    calibration_table()
    at_scale(out)
    failures(out)
    needs()
    print(f"\n{time.process_time() - t0:.1f} s of CPU; plots in {out}")


if __name__ == "__main__":
    main()
