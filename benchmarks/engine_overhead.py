"""Engine overhead: adloco against a plain PyTorch loop on the same model, data and batches.

1. One trainer x one worker: tokens/s of ``adloco train``'s rounds (the driver feeding the library's
   algorithm object) and of a user's own loop calling ``DiLoCo.step(batch)`` with their own AdamW, vs. a
   plain loop (AdamW, clip, same lr, same blocks in the same order). Target: within 5%.
2. Four workers in one process: one round's time vs. 4x the single-worker round. Target: within 5%.
3. What the gradient probe costs at the first inner step (reported, not a target).

Rounds are timed without evaluation; runs are interleaved and repeated, and medians reported, because a
2-core machine drifts. Usage:  python benchmarks/engine_overhead.py [--rounds 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from adloco import models
from adloco.algorithms.switch import plan as switch_plan
from adloco.baselines import DiLoCo
from adloco.comm.inprocess import InProcessComm
from adloco.config import resolve
from adloco.data.sampling import ShardStream, trainer_subset
from adloco.data.tokens import prepare
from adloco.engine.driver import Driver
from adloco.engine.inner import lr_at
from adloco.settings import Switch


def make_cfg(workers: int, trainers: int, rounds: int, H: int, b: int, probe: bool):  # type: ignore[no-untyped-def]
    # One round more than is run and an evaluation period beyond it: no timed round evaluates.
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
        ]
    )


def engine_tokens_per_s(cfg, data, factory) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(tokens/s, seconds per round) over the engine's rounds, evaluation excluded."""
    c = Driver(
        cfg, InProcessComm(cfg.algorithm.workers), data, factory, torch.device("cpu"), log=lambda s: None
    )
    c.run_round()  # warm-up round (allocator, kernels)
    t0 = time.perf_counter()
    rounds = cfg.algorithm.rounds - 2  # the config holds one round more than is run
    for _ in range(rounds):
        c.run_round()
    dt = time.perf_counter() - t0
    tokens = rounds * cfg.algorithm.workers * cfg.algorithm.inner_steps * cfg.batch.initial * cfg.data.seq_len
    return tokens / dt, dt / rounds


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


def plain_tokens_per_s(cfg, data, factory) -> float:  # type: ignore[no-untyped-def]
    """A plain loop: the same model, AdamW settings, clipping and blocks in the same order."""
    a, inner = cfg.algorithm, cfg.inner
    model, opt = _model_and_adamw(cfg, factory)
    b = cfg.batch.initial
    subset = trainer_subset(data.n_train, 1.0, a.seed, 0)
    total = a.rounds * a.inner_steps  # the same learning-rate schedule as the engine

    def one_round(r: int) -> None:
        stream = ShardStream(subset, a.seed, 0, r, 0, 1)
        for h in range(a.inner_steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(r * a.inner_steps + h, total, inner)
            loss = model(**data.train_batch(stream.take(b))).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), inner.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)

    timed = a.rounds - 2
    one_round(0)  # warm-up
    t0 = time.perf_counter()
    for r in range(1, 1 + timed):
        one_round(r)
    dt = time.perf_counter() - t0
    return timed * a.inner_steps * b * cfg.data.seq_len / dt


def library_tokens_per_s(cfg, data, factory) -> float:  # type: ignore[no-untyped-def]
    """A user's own loop: their model and AdamW (per-parameter, not adloco's flat groups) in DiLoCo,
    each inner step through ``algo.step(batch)``, the same blocks and schedule as the plain loop."""
    a, inner = cfg.algorithm, cfg.inner
    model, opt = _model_and_adamw(cfg, factory)
    b = cfg.batch.initial
    algo = DiLoCo(
        model, opt, inner_steps=a.inner_steps, batch_size=b, switch=Switch(b_max=b), clip=inner.clip
    )
    subset = trainer_subset(data.n_train, 1.0, a.seed, 0)
    total = a.rounds * a.inner_steps

    def one_round(r: int) -> None:
        stream = ShardStream(subset, a.seed, 0, r, 0, 1)
        for h in range(a.inner_steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(r * a.inner_steps + h, total, inner)
            algo.step(data.train_batch(stream.take(algo.batch_size())))

    timed = a.rounds - 2
    one_round(0)  # warm-up
    t0 = time.perf_counter()
    for r in range(1, 1 + timed):
        one_round(r)
    dt = time.perf_counter() - t0
    return timed * a.inner_steps * b * cfg.data.seq_len / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--inner-steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    base = resolve()
    data = prepare(base.data, log=lambda s: print(s, flush=True))

    factory = models.ModelFactory(base.model, data.vocab_size, base.data.seq_len, data.eos_id, data.pad_id)

    assert switch_plan(args.batch, args.batch, "threshold", 2.0).accum == 1
    R, H, b = args.rounds, args.inner_steps, args.batch
    one = make_cfg(1, 1, R, H, b, probe=False)
    four = make_cfg(4, 4, R, H, b, probe=False)
    probed = make_cfg(1, 1, R, H, b, probe=True)
    plain, eng1, eng4, prb, lib = [], [], [], [], []
    for rep in range(args.repeats):
        plain.append(plain_tokens_per_s(one, data, factory))
        lib.append(library_tokens_per_s(one, data, factory))
        tps, per_round = engine_tokens_per_s(one, data, factory)
        eng1.append((tps, per_round))
        eng4.append(engine_tokens_per_s(four, data, factory)[1])
        prb.append(engine_tokens_per_s(probed, data, factory)[1])
        print(
            f"repeat {rep + 1}: plain {plain[-1]:.0f} tok/s, own loop {lib[-1]:.0f} tok/s, engine 1x1 {tps:.0f} tok/s, "
            f"round 1 worker {per_round:.3f}s, 4 workers {eng4[-1]:.3f}s, 1 worker probed {prb[-1]:.3f}s",
            flush=True,
        )
    p_med = statistics.median(plain)
    e_med = statistics.median(t for t, _ in eng1)
    l_med = statistics.median(lib)
    r1 = statistics.median(r for _, r in eng1)
    r4 = statistics.median(eng4)
    rp = statistics.median(prb)
    print()
    print(
        f"model {base.model.name}, seq_len {base.data.seq_len}, batch {b}, H {H}, {R - 1} timed rounds, "
        f"{torch.get_num_threads()} threads, median of {args.repeats}"
    )
    print(f"plain loop            {p_med:8.0f} tokens/s")
    print(f"engine 1 trainer x 1  {e_med:8.0f} tokens/s  ({100 * (e_med / p_med - 1):+.1f}% vs plain)")
    print(f"own loop, DiLoCo.step {l_med:8.0f} tokens/s  ({100 * (l_med / p_med - 1):+.1f}% vs plain)")
    print(f"engine 4 workers      {r4:8.3f} s/round  ({100 * (r4 / (4 * r1) - 1):+.1f}% vs 4 x {r1:.3f}s)")
    print(f"probe at step 1       {rp - r1:8.3f} s/round  ({100 * (rp / r1 - 1):+.1f}% of a round of H={H})")


if __name__ == "__main__":
    main()
