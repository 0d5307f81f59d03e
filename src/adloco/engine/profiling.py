"""``adloco profile``: time a worker's inner step on a device and write its step-time profile.

The profile itself (:class:`adloco.profile.StepProfile`, the fit t(m, a) = a·(α + β·m) + δ) is pure and
lives in :mod:`adloco.profile`, below the config and the engine; this is the command that builds a
config's model and data on its device to measure one (ALGORITHM.md §11).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adloco.args import add_config_option, add_set_option
from adloco.errors import UserError
from adloco.profile import StepProfile, fit, measure


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "profile",
        help="time a worker's step at several micro-batch sizes and fit its cost t(m, a) = a(α + βm) + δ",
        description="Time one worker's forward and backward at several micro-batch sizes, and its optimizer "
        "step, for a config's model, sequence length and device; fit α (a micro-batch's fixed cost), β (its "
        "cost per row) and δ (the optimizer step), and write them as a JSON profile that prices simulated "
        "time (adloco report/bench --profile, runtime.profile). ALGORITHM.md §11.",
    )
    add_config_option(p, "YAML config (the model, data and device to profile)")
    add_set_option(p, "override one field of the config (repeatable)")
    p.add_argument(
        "--sizes", default="1,2,4,8", help="micro-batch sizes to time, at least 3 (default 1,2,4,8)"
    )
    p.add_argument("--repeats", type=int, default=5, help="timings per size; the median counts (default 5)")
    p.add_argument("--out", default="profile.json", help="where to write the profile (default profile.json)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        sizes = []
    if len(sizes) < 3 or sizes[0] < 1:
        raise UserError(
            f"--sizes {text!r}: must be at least 3 different micro-batch sizes >= 1, e.g. 1,2,4,8"
        )
    return sizes


def command(args: Any) -> int:
    """``adloco profile``: measure, fit, write, and say what was found in one line."""
    import numpy as np
    import torch

    from adloco.config import resolve
    from adloco.data.tokens import prepare
    from adloco.engine.inner import local_inner, make_optimizer
    from adloco.engine.placement import resolve_device
    from adloco.library.flat import flatten
    from adloco.library.replica import Replica, rows, to_device
    from adloco.models import factory_for

    sizes = parse_sizes(args.sizes)
    if args.repeats < 1:
        raise UserError(f"--repeats {args.repeats}: must be >= 1")
    out = Path(args.out)
    if out.is_dir():
        raise UserError(f"--out {str(out)!r}: a folder, not a file")
    if not out.parent.is_dir():
        raise UserError(f"--out {str(out)!r}: its folder does not exist")
    cfg = resolve(args.config, args.overrides)
    device = resolve_device(cfg.runtime.device)
    if cfg.runtime.threads:
        torch.set_num_threads(cfg.runtime.threads)
    data = prepare(cfg.data, cfg.model.task, cfg.model.trust_remote_code, log=print)
    if data.n_train < sizes[-1]:
        raise UserError(f"--sizes: {sizes[-1]} rows, but the training split holds {data.n_train} examples")
    model = factory_for(cfg.model, cfg.data.seq_len, data).build(cfg.algorithm.seed).to(device)
    model.train()
    rep = Replica(
        model,
        make_optimizer(flatten(model), local_inner(cfg.inner, device.type, cfg.model.task)),
        clip=cfg.inner.clip,
        precision=cfg.model.precision,
    )
    full = data.train_batch(np.arange(sizes[-1]))

    def forward_backward(m: int) -> None:
        rep.flat.zero_grad()
        rep.forward_backward(to_device(rows(full, 0, m), device), 1.0)

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    print(
        f"profiling {cfg.model.name} on {device.type}: micro-batches of {', '.join(map(str, sizes))} rows of "
        f"{cfg.data.seq_len} tokens, {args.repeats} timings each"
    )
    timings, delta = measure(forward_backward, rep.optimizer_step, sizes, args.repeats, sync)
    alpha, beta, residual = fit(timings)
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({torch.get_num_threads()} threads)"
    )
    prof = StepProfile(
        alpha,
        beta,
        delta,
        device=name,
        torch=torch.__version__,
        model=cfg.model.name,
        seq_len=cfg.data.seq_len,
        b_max=cfg.switch.b_max or sizes[-1],
        residual=residual,
        timings={str(m): t for m, t in timings.items()},
    )
    prof.save(out)
    b0 = cfg.batch.initial
    print(
        f"α = {alpha * 1e3:.2f} ms a micro-batch, β = {beta * 1e3:.2f} ms a row, δ = {delta * 1e3:.2f} ms the "
        f"optimizer step (fit residual {100 * residual:.1f}%); fixed share at b₀ = {b0}: "
        f"φ = {prof.fixed_share(b0):.2f}\nprofile: {out}"
    )
    return 0
