"""The first lines of a run: what trains, on what, and how it communicates, read from the resolved config
alone, so that what a user set (or a preset filled) is what the console says is in effect."""

from __future__ import annotations

from typing import Any

from adloco.config import Config


def _name(x: Any) -> str:
    """A choice as words: a preset's name, a codec's or a factory's ``name`` / ``__name__``."""
    if isinstance(x, str):
        return x
    return str(getattr(x, "name", None) or getattr(x, "__name__", None) or x)


def ns_text(setting: str, chosen: str | None) -> str:
    """The dtype of Muon's Newton–Schulz iterations as a run says it: ``auto`` with what the run chose
    (:func:`adloco.engine.inner.agreed_inner`; and why, where float32), when it is known."""
    if setting != "auto" or chosen is None:
        return setting
    why = ", a CPU without native bfloat16 matmuls" if chosen == "float32" else ""
    return f"{chosen} (auto{why})"


def optimizer_text(setting: str, chosen: str | None, kept: bool = False, task: str = "causal_lm") -> str:
    """The inner optimizer as a run says it: ``auto`` with what the run chose and why, when it is known
    (``kept``: the choice of the run's checkpoint, which a resumed run goes on with; ``task``: the model's)."""
    if setting != "auto" or chosen is None:
        return setting
    if kept:
        why = "kept from the run's checkpoint"
    elif chosen == "muon":
        why = "every process on a CPU"
    elif task != "causal_lm":
        why = f"a {task} model, where Muon is not measured"
    else:
        why = "a GPU, where Muon is not yet timed"
    return f"{chosen} (auto: {why})"


def inner_text(
    cfg: Config, ns_dtype: str | None = None, optimizer: str | None = None, kept: bool = False
) -> str:
    i = cfg.inner
    runs = optimizer if i.optimizer == "auto" and optimizer is not None else i.optimizer
    said = optimizer_text(i.optimizer, optimizer, kept, cfg.model.task)
    words = [f"{said} lr {i.lr:g}", f"{i.schedule} schedule"]
    if runs == "muon":
        words.append(f"Muon lr ×{i.muon_lr_ratio:g}, Newton–Schulz in {ns_text(i.muon_ns_dtype, ns_dtype)}")
    if i.state != "keep":
        words.append(f"state {i.state}")
    return ", ".join(words)


# The inner keys one optimizer reads and another does not: which inner.optimizer values read each.
# ``auto`` reads what either of its choices reads (a config is compared before the device decides).
READ_BY = {
    "momentum": ("sgd",),
    "betas": ("adamw", "muon", "auto"),
    "muon_lr_ratio": ("muon", "auto"),
    "muon_momentum": ("muon", "auto"),
    "muon_adjust_lr": ("muon", "auto"),
    "muon_ns_dtype": ("muon", "auto"),
}


def inner_as_read(inner: dict[str, Any]) -> dict[str, Any]:
    """An inner section (as a config file says it) without the keys its ``optimizer`` does not read: what
    two runs' inner optimizers have to agree on (Muon's keys with AdamW do not part them, so a default of
    theirs changed since leaves an AdamW run as it was)."""
    return {k: v for k, v in inner.items() if k not in READ_BY or inner.get("optimizer") in READ_BY[k]}


def unread_note(cfg: Config) -> str | None:
    """One line naming the inner keys set away from their defaults that the inner optimizer in effect does
    not read (``inner.muon_ns_dtype`` with AdamW, ``inner.momentum`` with Muon): kept as set, said, not
    refused, so that a bench's shared ``--set`` can reach the variants that read it; else None."""
    i, default = cfg.inner, type(cfg.inner)()
    unread = [
        f"inner.{key} {getattr(i, key)} (read by {' or '.join(r for r in readers if r != 'auto')})"
        for key, readers in READ_BY.items()
        if i.optimizer not in readers and getattr(i, key) != getattr(default, key)
    ]
    if not unread:
        return None
    return f"inner.optimizer {i.optimizer} does not read {', '.join(unread)}: kept as set, with no effect"


def muon_note(cfg: Config, device_type: str) -> str | None:
    """One line where Muon orthogonalizes in bfloat16 on a CPU that emulates bfloat16 matmuls (no
    AVX512-BF16 or AMX): its Newton–Schulz iterations then cost several times a float32 step; else None."""
    from adloco.library.optim import emulates_bfloat16

    i = cfg.inner
    if (
        i.optimizer != "muon"
        or i.muon_ns_dtype != "bfloat16"
        or device_type != "cpu"
        or not emulates_bfloat16()
    ):
        return None
    return (
        "inner.muon_ns_dtype bfloat16 on a CPU without native bfloat16 matmuls (no AVX512-BF16 or AMX): Muon's "
        "Newton–Schulz iterations run emulated, at several times a float32 step's cost (benchmarks/RESULTS.md, "
        "Muon's Newton–Schulz on a CPU); inner.muon_ns_dtype float32 runs them natively"
    )


def outer_text(cfg: Config) -> str:
    o = cfg.outer
    if cfg.algorithm.method == "ddp":
        return "none (the gradients are averaged every step)"
    name = _name(o.optimizer)
    if name == "average":
        return "average (θ ← the workers' mean)"
    if name == "sgd":
        return f"sgd lr {o.lr:g}"
    if name == "nesterov":
        return f"nesterov lr {o.lr:g} momentum {o.momentum:g}"
    return name  # the library user's own optimizer


def wire_text(dtype: Any, cfg: Config) -> str:
    """How one wire travels: its dtype, and the dials that belong to it."""
    c = cfg.comm
    name = _name(dtype)
    if name in ("int8", "int4"):
        name += f" (blocks of {c.block})"
    elif name == "topk":
        name += f" ({100 * c.topk_fraction:.3g}% of blocks of {c.topk_block}, {c.topk_bits}-bit values)"
    return name


def overlap_text(cfg: Config) -> str:
    c = cfg.sync
    if c.fragments > 1:
        return f"streaming in {c.fragments} fragments, {c.fragment_delay} step(s) behind compute"
    return {"none": "none (each round waits for its Δ)", "delayed": "delayed (Δ lands a round late)"}.get(
        c.overlap, f"{c.overlap} (workers go on from their own Δ's step while it travels)"
    )


def describe_run(
    cfg: Config,
    n_params: int,
    data: str,
    device: str,
    processes: str = "",
    ns_dtype: str | None = None,
    optimizer: str | None = None,
    kept: bool = False,
) -> list[str]:
    """The lines a run prints first (rank 0): the method, the model and its parameters, the workers and
    trainers, the data, the device; the inner and outer optimizer; the wire of Δ and of θ, error feedback
    when set, and the overlap in effect. ``data`` and ``device`` are said as the caller knows them,
    ``processes`` (``", 2 processes x 1 thread(s)"``) under torch.distributed; ``ns_dtype`` is what Muon's
    ``auto`` became, ``optimizer`` what ``inner.optimizer: auto`` became (both
    :func:`adloco.engine.inner.agreed_inner`; ``kept``: the checkpoint's choice). A line is a string: add
    one for a new dial here."""
    a, c = cfg.algorithm, cfg.comm

    def count(n: int, what: str) -> str:
        return f"{n} {what}{'' if n == 1 else 's'}"

    ddp = a.method == "ddp"
    delta = f"gradients {wire_text(c.dtype, cfg)} every step" if ddp else f"Δ {wire_text(c.dtype, cfg)}"
    follows = c.theta_dtype is None and c.compressed  # θ's wire null: it follows Δ's codec
    theta = wire_text(c.theta_wire, cfg) + (", following Δ" if follows else "")
    if not c.compressed:
        feedback = ""
    elif c.feedback:
        feedback = f", error feedback on{f' (decay β {c.decay:g})' if c.decay != 1 else ''}"
    else:
        feedback = ", error feedback off"
    overlap = "none (synchronous)" if ddp else overlap_text(cfg)
    return [
        f"{a.method}: {cfg.model.name}, {n_params / 1e6:.2f}M parameters, {count(a.workers, 'worker')}, "
        f"{count(a.trainers, 'trainer')}{processes}, {data}, device {device}",
        f"optimizers: inner {inner_text(cfg, ns_dtype, optimizer, kept)}; outer {outer_text(cfg)}",
        f"wire: {delta}{feedback}, θ {theta} (merges, moves); overlap {overlap}",
    ]
