"""Engine overhead: adloco against a plain PyTorch loop on the same model, data and batches, paired.

Target: the engine (and a user's loop over the library) within 5% of the plain loop's tokens/s.

Variants (one worker, the default config's model and data; batch 16, H 16, fp32, 1 thread):
  plain    a plain loop: per-parameter AdamW (no decay on vectors), clip, the engine's lr schedule,
           the same blocks in the same order;
  library  a user's own loop over ``DiLoCo.step(batch)`` with their own AdamW (the same blocks);
  engine   ``adloco train``'s driver (``Driver.run_round``) with 1 worker x 1 trainer;
optional (``--variants``): ``engine4`` (4 workers x 4 trainers in one process: tokens/s vs the plain loop,
1.0 = no overhead beyond running the 4 one after another) and ``probed`` (engine 1x1 with the gradient
probe at every round's first step).

Design. Every variant is built once, in one process, and warmed up (``--warmup`` rounds each). Then come
``--blocks`` blocks; a block times one round (H inner steps, the round's sync included) of every variant,
back to back, in an order that cycles through all permutations (every variant is first, last, and after
every other equally often when ``--blocks`` is a multiple of their number: 6 for three variants), with
``gc.collect()`` before each timed round. A drift in machine speed hits
the variants of a block alike, so the per-block ratio tokens/s(variant) / tokens/s(plain) cancels it.
Reported: median tokens/s over blocks, the median per-block ratio to plain, and its 95% confidence
interval (percentile bootstrap of that median over blocks, 10,000 resamples); the interval's half-width
is the benchmark's resolution. No timed round evaluates: the engine's ``eval.every`` and ``rounds`` lie
beyond the rounds run (checked), and the other variants never evaluate.

Command (about 7 minutes on the 2-core CPU machine, 1 thread):
    .venv/bin/python benchmarks/engine_overhead.py --json engine_overhead.json
Smoke check (under a minute): add ``--quick``. Options: ``--blocks``, ``--warmup``, ``--threads``,
``--inner-steps``, ``--batch``, ``--variants``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import platform
import sys
import time
from typing import Any

import numpy as np
import torch

from adloco import models
from adloco.config import resolve
from adloco.data.sampling import ShardStream, trainer_subset
from adloco.data.tokens import prepare
from adloco.engine.driver import Driver
from adloco.engine.inner import lr_at
from adloco.library.algorithms.switch import plan as switch_plan
from adloco.library.baselines import DiLoCo
from adloco.library.comm.inprocess import InProcessComm
from adloco.library.settings import Switch

VARIANTS = ("plain", "library", "engine", "engine4", "probed")
BOOTSTRAP = 10_000


def make_cfg(workers: int, trainers: int, rounds: int, H: int, b: int, probe: bool):  # type: ignore[no-untyped-def]
    """The run's config; ``rounds`` are the rounds the benchmark runs: the config holds one more and an
    evaluation period beyond it, so no round run evaluates (neither periodically nor as the final one)."""
    return resolve(
        overrides=[
            f"algorithm.workers={workers}",
            f"algorithm.trainers={trainers}",
            f"algorithm.rounds={rounds + 1}",
            f"eval.every={rounds + 2}",
            f"algorithm.inner_steps={H}",
            f"batch.initial={b}",
            f"batch.max={b}",
            f"switch.b_max={b}",
            "batch.test=none",
            f"batch.statistics={str(probe).lower()}",
            "merge.policy=none",
            "logging.progress=off",
            "inner.optimizer=adamw",  # as RESULTS.md measured it: the default became auto (Muon on a CPU)
        ]
    )


def _model_and_adamw(cfg, factory):  # type: ignore[no-untyped-def]
    """The model at the run's seed and a per-parameter AdamW with the engine's settings (no decay on
    vectors), as a user's own loop would build them."""
    model = factory.build(cfg.algorithm.seed)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.inner.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.inner.lr,
        betas=tuple(cfg.inner.betas),
    )
    return model, opt


class Plain:
    """A plain loop: the same model, AdamW settings, clipping, lr schedule and blocks in the same order."""

    def __init__(self, cfg, data, factory) -> None:  # type: ignore[no-untyped-def]
        self.cfg, self.data = cfg, data
        self.model, self.opt = _model_and_adamw(cfg, factory)
        self.model.train()
        self.subset = trainer_subset(data.n_train, cfg.data.subset_fraction, cfg.algorithm.seed, 0)
        self.r = 0
        self.tokens = cfg.algorithm.inner_steps * cfg.batch.initial * cfg.data.seq_len

    def run_round(self) -> None:
        a, inner, b, r = self.cfg.algorithm, self.cfg.inner, self.cfg.batch.initial, self.r
        model, opt = self.model, self.opt
        total = a.rounds * a.inner_steps  # the engine's schedule
        stream = ShardStream(self.subset, a.seed, 0, r, 0, 1)
        for h in range(a.inner_steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(r * a.inner_steps + h, total, inner)
            loss = model(**self.data.train_batch(stream.take(b))).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), inner.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        self.r += 1

    def evaluated(self) -> bool:
        return False


class Library:
    """A user's own loop: their model and AdamW (per-parameter, not adloco's flat groups) in DiLoCo, each
    inner step through ``algo.step(batch)``, the same blocks and schedule as the plain loop."""

    def __init__(self, cfg, data, factory) -> None:  # type: ignore[no-untyped-def]
        self.cfg, self.data = cfg, data
        a, b = cfg.algorithm, cfg.batch.initial
        model, self.opt = _model_and_adamw(cfg, factory)
        model.train()
        self.algo = DiLoCo(
            model,
            self.opt,
            inner_steps=a.inner_steps,
            batch_size=b,
            switch=Switch(b_max=b),
            clip=cfg.inner.clip,
        )
        self.subset = trainer_subset(data.n_train, cfg.data.subset_fraction, a.seed, 0)
        self.tokens = a.inner_steps * b * cfg.data.seq_len

    def run_round(self) -> None:
        a, inner, algo = self.cfg.algorithm, self.cfg.inner, self.algo
        r = algo.round
        total = a.rounds * a.inner_steps
        stream = ShardStream(self.subset, a.seed, 0, r, 0, 1)
        for h in range(a.inner_steps):
            for g in self.opt.param_groups:
                g["lr"] = lr_at(r * a.inner_steps + h, total, inner)
            algo.step(self.data.train_batch(stream.take(algo.batch_size())))
        assert algo.round == r + 1

    def evaluated(self) -> bool:
        return False


class Engine:
    """``adloco train``'s rounds: the driver feeding the library's algorithm object."""

    def __init__(self, cfg, data, factory) -> None:  # type: ignore[no-untyped-def]
        self.cfg = cfg
        a = cfg.algorithm
        self.driver = Driver(
            cfg, InProcessComm(a.workers), data, factory, torch.device("cpu"), log=lambda s: None
        )
        self.tokens = a.workers * a.inner_steps * cfg.batch.initial * cfg.data.seq_len

    def run_round(self) -> None:
        self.driver.run_round()

    def evaluated(self) -> bool:
        return bool(self.driver.last_eval)


def build(name: str, rounds: int, H: int, b: int, data, factory):  # type: ignore[no-untyped-def]
    if name == "plain":
        return Plain(make_cfg(1, 1, rounds, H, b, probe=False), data, factory)
    if name == "library":
        return Library(make_cfg(1, 1, rounds, H, b, probe=False), data, factory)
    if name == "engine":
        return Engine(make_cfg(1, 1, rounds, H, b, probe=False), data, factory)
    if name == "engine4":
        return Engine(make_cfg(4, 4, rounds, H, b, probe=False), data, factory)
    if name == "probed":
        return Engine(make_cfg(1, 1, rounds, H, b, probe=True), data, factory)
    raise ValueError(name)


def timed_round(v: Any) -> float:
    gc.collect()
    t0 = time.perf_counter()
    v.run_round()
    return time.perf_counter() - t0


def bootstrap_median_ci(x: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of x (resampling blocks)."""
    idx = rng.integers(0, len(x), size=(BOOTSTRAP, len(x)))
    meds = np.median(x[idx], axis=1)
    lo, hi = np.percentile(meds, [2.5, 97.5])
    return float(lo), float(hi)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--blocks",
        type=int,
        help="paired blocks, each one timed round of every variant (default 18: 3 cycles of 6 orders)",
    )
    ap.add_argument("--warmup", type=int, help="untimed rounds of every variant first (default 2)")
    ap.add_argument("--inner-steps", type=int, help="H: inner steps per round (default 16)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    ap.add_argument(
        "--variants",
        default="plain,library,engine",
        help=f"comma-separated, from {','.join(VARIANTS)} (plain is always included)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="a smoke check: H 4, 1 warm-up round, 6 blocks (unless given)"
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results (every block's times) as JSON")
    args = ap.parse_args()
    for key, full, quick in (("blocks", 18, 6), ("warmup", 2, 1), ("inner_steps", 16, 4)):
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    names = ["plain"] + [n for n in dict.fromkeys(args.variants.split(",")) if n and n != "plain"]
    for n in names:
        if n not in VARIANTS:
            ap.error(f"--variants: unknown {n!r} (known: {', '.join(VARIANTS)})")
    if args.blocks < 2:
        ap.error("--blocks: at least 2")
    if args.threads:
        torch.set_num_threads(args.threads)

    base = resolve()
    data = prepare(base.data, log=lambda s: print(s, flush=True))
    factory = models.ModelFactory(base.model, data.vocab_size, base.data.seq_len, data.eos_id, data.pad_id)
    H, b = args.inner_steps, args.batch
    assert switch_plan(b, b, "threshold", 2.0).accum == 1
    rounds = args.warmup + args.blocks
    variants = {n: build(n, rounds, H, b, data, factory) for n in names}

    t_start = time.perf_counter()
    for _ in range(args.warmup):
        for n in names:
            variants[n].run_round()
    orders = list(itertools.permutations(names))
    secs: dict[str, list[float]] = {n: [] for n in names}
    for i in range(args.blocks):
        for n in orders[i % len(orders)]:
            secs[n].append(timed_round(variants[n]))
        line = ", ".join(f"{n} {variants[n].tokens / secs[n][-1]:.0f}" for n in names)
        print(f"block {i + 1}/{args.blocks}: tokens/s {line}", flush=True)
    wall = time.perf_counter() - t_start
    evaluated = [n for n in names if variants[n].evaluated()]
    assert not evaluated, f"a timed round evaluated: {evaluated}"

    rng = np.random.default_rng(0)
    plain_s = np.array(secs["plain"])
    plain_tok = variants["plain"].tokens
    rows = []
    for n in names:
        s = np.array(secs[n])
        tps = variants[n].tokens / s
        ratio = (variants[n].tokens / s) / (plain_tok / plain_s)  # per block
        lo, hi = bootstrap_median_ci(ratio, rng) if n != "plain" else (1.0, 1.0)
        rows.append(
            {
                "variant": n,
                "tokens_per_s": float(np.median(tps)),
                "tokens_per_s_min": float(tps.min()),
                "tokens_per_s_max": float(tps.max()),
                "ratio": float(np.median(ratio)),
                "ci95": [lo, hi],
                "round_s": secs[n],
            }
        )

    print()
    print(
        f"model {base.model.name}, seq_len {base.data.seq_len}, batch {b}, H {H}, {torch.get_num_threads()} "
        f"thread(s); {args.warmup} warm-up round(s), then {args.blocks} paired blocks of one round per variant "
        f"({wall / 60:.1f} min); no timed round evaluates"
    )
    print("ratio: median over blocks of tokens/s(variant) / tokens/s(plain) in the same block;")
    print(
        f"95% CI: percentile bootstrap of that median over the {args.blocks} blocks ({BOOTSTRAP} resamples)"
    )
    print()
    print(f"{'variant':<10} {'tokens/s':>9} {'ratio':>7}   {'95% CI':<16}")
    for row in rows:
        lo, hi = row["ci95"]
        ci = "" if row["variant"] == "plain" else f"[{lo:.3f}, {hi:.3f}]"
        print(f"{row['variant']:<10} {row['tokens_per_s']:9.0f} {row['ratio']:7.3f}   {ci:<16}")
    drift = max(secs["plain"]) / min(secs["plain"]) - 1
    print(
        f"\nplain round times varied by {100 * drift:.1f}% between blocks (max / min - 1), the drift the pairing cancels"
    )

    if args.json:
        out = {
            "benchmark": "engine_overhead",
            "command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
            "model": base.model.name,
            "seq_len": base.data.seq_len,
            "batch": b,
            "inner_steps": H,
            "threads": torch.get_num_threads(),
            "warmup_rounds": args.warmup,
            "blocks": args.blocks,
            "orders": "all permutations, cycled",
            "ratio": "median over blocks of tokens/s(variant) / tokens/s(plain), same block",
            "ci": f"95% percentile bootstrap of the median over blocks, {BOOTSTRAP} resamples, seed 0",
            "evaluation": "none in any timed round",
            "wall_s": wall,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "variants": rows,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
