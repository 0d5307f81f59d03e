"""Run directories made by hand, as `adloco train` writes them, for the tests of what reads them (`adloco
report`, the plots, `adloco bench`, the profile and network read-outs). Light on purpose: no torch, so a
stand-in for `adloco train` in a subprocess imports it at once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from adloco import events


def recorded_run(
    root: Path,
    name: str,
    method: str,
    ppls: list[float],
    bytes_per_round: int,
    seed: int = 0,
    config: dict[str, dict[str, Any]] | None = None,
    label: str | None = None,
) -> Path:
    """A run directory as `adloco train` writes it: 2 workers of 50 examples a round (worker w computes
    for 1 + w s), one Δ all-reduce a round; ``config`` adds keys to its config.yaml."""
    run = root / name
    run.mkdir(parents=True)
    cfg: dict[str, dict[str, Any]] = {
        "algorithm": {"method": method, "trainers": 1, "workers": 2, "seed": seed},
        "batch": {"eta": 0.5},
        "network": {"bandwidth": 1e6, "latency": 0.01},
        "runtime": {},
        "logging": {"name": label or name},
    }
    for section, values in (config or {}).items():
        cfg.setdefault(section, {}).update(values)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    evs: list[events.Event] = [
        events.Start(
            round=0,
            parameters=10,
            workers=2,
            trainers=1,
            allocation={0: 0, 1: 0},
            task="causal_lm",
            train_examples=1000,
            val_examples=10,
            processes=1,
            threads_per_process=1,
            val_ppl=100.0,
        )
    ]
    for r, ppl in enumerate(ppls, 1):
        for w in (0, 1):
            evs.append(
                events.Worker(
                    round=r,
                    worker=w,
                    trainer=0,
                    loss=1.0,
                    examples=50,
                    probe_examples=0,
                    micro=4,
                    accum=1,
                    effective=4,
                    capped=False,
                    finite=True,
                    compute_s=1.0 + w,
                )
            )
        evs.append(
            events.Trainer(
                round=r,
                trainer=0,
                workers=[0, 1],
                request=4 * r,
                request_next=4 * r + 4,
                target=None,
                reason="grew",
                loss=1.0,
                sigma2=8.0,
                gbar_sq=1.0,
                samples=16,
                effective=4,
                micro=4,
                accum=1,
            )
        )
        evs.append(
            events.Round(
                round=r,
                trainers_alive=1,
                requests={0: 4 * r + 4},
                allocation={0: 0, 1: 0},
                switch_mode="threshold",
                loss=1.0,
                examples=100,
                examples_total=100 * r,
                bytes=bytes_per_round,
                bytes_total=bytes_per_round * r,
                communications=1,
                communications_total=r,
                round_s=3.0,
                train_s=3.0,
                comm_s=0.0,
                max_compute_s=2.0,
                collectives=[["delta", "all_reduce", 2, bytes_per_round // 2, 1]],
                sim_s=0.0,
                sim_total_s=0.0,
                val_ppl=ppl,
            )
        )
    events_ = [e.to_dict() for e in evs]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(e) for e in events_) + "\n")
    (run / "summary.json").write_text(json.dumps({"wall_s": 10.0, "peak_memory_bytes": 2_000_000}))
    return run


def rewrite(run: Path, edit: Callable[[dict[str, Any]], list[dict[str, Any]]]) -> Path:
    """Each event of the run's metrics.jsonl replaced by the events ``edit`` returns for it."""
    path = run / "metrics.jsonl"
    evs = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(x) + "\n" for e in evs for x in edit(e)))
    return run
