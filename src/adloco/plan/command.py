"""``adloco simulate``: a run priced before it is rented, from a config and its ``simulate`` section.

The run is the config ``adloco train`` would read (``algorithm.*``: method, N, K, H, rounds, seed;
``comm.*``: the codec, overlap, fragments; ``network.*``: the links and sites; ``batch.initial``,
``switch.b_max``, ``runtime.profile``, ``runtime.balance``, ``elastic.checkpoint_every``), checked as a
plan (not against this machine); the ``simulate`` section adds what only a plan has: the model as a
parameter count, the device as seconds a step or tokens a second, per-worker speeds and links, and the
failures. It prints a table (what a pipe and a terminal get alike), and with ``--json`` and ``--plots``
writes the numbers and the plots against N and bandwidth, every file complete or not there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from adloco.args import add_config_option, add_set_option
from adloco.errors import UserError
from adloco.library.fields import Dial, setting

WORKERS_SWEEP = [8, 16, 32, 64, 128, 256, 512, 1024]
MBITS_SWEEP = [10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0]


@dataclass(frozen=True)
class SimulateConfig(Dial):
    """The ``simulate`` section of a config file (or ``--set simulate.KEY=VALUE``): read by ``adloco
    simulate`` alone, ignored by every other command."""

    SECTION: ClassVar[str] = "simulate"
    model: str | None = setting(
        None,
        "the model: a preset, a Hugging Face config (a config.json or its folder) or a parameter count "
        "(10e9, 72B, 1.3B); null: model.name",
    )
    step_s: float | None = setting(
        None,
        "the device: seconds one worker's inner step of batch.initial rows takes (null: simulate.tokens_per_s "
        "or runtime.profile)",
        above=0,
        unit="seconds",
    )
    tokens_per_s: float | None = setting(
        None,
        "the device: tokens a second one worker trains (a step: batch.initial × data.seq_len tokens)",
        above=0,
        unit="tokens per second",
    )
    speeds: list[float] = setting(
        [],
        "relative compute speeds, worker w's the (w mod length)-th (empty: all 1; 0.5 takes twice as long)",
        above=0,
        at_most=1,
    )
    link_speeds: list[float] = setting(
        [],
        "relative link speeds, worker w's the (w mod length)-th, times network.bandwidth (and upload)",
        above=0,
        at_most=1,
    )
    ddp_overlap: float = setting(
        0.0,
        "ddp: the share of a step its gradients' all-reduce runs behind (0: after the backward pass, as the "
        "engine does; 0.67: behind the backward pass)",
        at_least=0,
        below=1,
    )
    mtbf_s: float | None = setting(
        None,
        "each worker's mean time between failures, seconds (null: none)",
        above=0,
        unit="seconds",
    )
    restart_s: float = setting(
        10.5,
        "seconds a failure (or, under restart recovery, a join) costs: every process restarting (10.5 s "
        "measured, RESULTS 'Runs that survive failures'), or the lost worker coming back (live)",
        at_least=0,
    )
    recovery: Literal["restart", "live"] = setting(
        "restart",
        "restart: the elastic policy, every process restarts and resumes from the newest checkpoint "
        "(elastic.checkpoint_every); live: the lost worker's round is dropped and it rejoins, the others go on",
    )
    checkpoint_s: float = setting(
        0.0, "restart: seconds training waits for each checkpoint", at_least=0, unit="seconds"
    )
    joins: list[float] = setting(
        [], "seconds into the run at which a worker joins", at_least=0, unit="seconds"
    )
    sweep_workers: list[int] = setting(
        WORKERS_SWEEP, "--plots: the numbers of workers of the plot against N", at_least=1
    )
    sweep_mbits: list[float] = setting(
        MBITS_SWEEP, "--plots: the link bandwidths (Mbit/s) of the plot against bandwidth", above=0
    )

    def check(self) -> None:
        given = [k for k in ("step_s", "tokens_per_s") if getattr(self, k) is not None]
        self.need(len(given) < 2, "tokens_per_s", "null when simulate.step_s is set (one device)")
        self.need(bool(self.sweep_workers), "sweep_workers", "at least one number of workers")
        self.need(bool(self.sweep_mbits), "sweep_mbits", "at least one bandwidth")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="price a run at N workers before renting it: utilization, goodput after failures, time and "
        "bytes per round",
        description="Price a run described by a config (algorithm.*, comm.*, network.*) and its simulate "
        "section (the model as a count, the device, speeds, links, failures) on the engine's own accounting: "
        "each codec's exact bytes, the network model of simulated time (per-worker links, sites), step-time "
        "profiles, the elastic restart policy. Prints a table; --json and --plots write the numbers and the "
        "plots against N and bandwidth.",
    )
    add_config_option(p, "YAML config, with an optional `simulate` section")
    add_set_option(p, "override one field, simulate.* included (repeatable; wins over the file)")
    p.add_argument("--json", metavar="FILE", help="write the numbers as JSON")
    p.add_argument("--plots", metavar="DIR", help="draw utilization against N and against bandwidth (PNG)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def read_section(raw: Any, overrides: list[tuple[str, Any]], origin: str) -> SimulateConfig:
    """The ``simulate`` section from a file's mapping and ``--set simulate.*``, each key read as its field's
    type; every mistake one line naming the key."""
    from adloco.config.load import read_keys

    if raw is not None and not isinstance(raw, dict):
        raise UserError(
            f"{origin}: simulate = {raw!r}: a section must be a mapping of its keys, e.g. 'simulate: {{step_s: 0.8}}'"
        )
    values = read_keys("simulate", SimulateConfig, [*(raw or {}).items(), *overrides])
    try:
        return SimulateConfig(**values)
    except ValueError as exc:
        raise UserError(f"config: {exc}") from None


_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([kKMBT]?)\s*$")
_UNITS = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def parameters(spec: str, tokenizer: str, field: str) -> int:
    """A model's parameter count: a preset (its Llama shape, the vocabulary of ``bpe:N``), a Hugging Face
    config (built on the meta device, nothing allocated), or a count."""
    from adloco.models.sizing import SHAPES, llama_parameters

    allowed = (
        f"a preset ({', '.join(SHAPES)}), a Hugging Face config (a config.json or its folder) or a parameter "
        "count such as 10e9 or 72B"
    )
    m = _COUNT.match(spec)
    if m:
        n = int(round(float(m.group(1)) * _UNITS[m.group(2)]))
        if n < 1:
            raise UserError(f"config: {field} = {spec!r}: must be {allowed} (at least 1 parameter)")
        return n
    if spec in SHAPES:
        if not tokenizer.startswith("bpe:"):
            raise UserError(
                f"config: {field} = {spec!r}: a preset's size needs its vocabulary: set data.tokenizer=bpe:<vocab "
                "size>, or give the model as a parameter count"
            )
        return llama_parameters(SHAPES[spec], int(tokenizer[4:]))
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return _hf_parameters(path, field, spec)
    raise UserError(f"config: {field} = {spec!r}: must be {allowed}")


def _hf_parameters(path: Path, field: str, spec: str) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        cfg = AutoConfig.from_pretrained(str(path.parent), local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:  # a config transformers cannot read or build: its words, in one line
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"config: {field} = {spec!r}: not a Hugging Face model config ({why})") from None
    return int(model.num_parameters())


def setup(cfg: Any, sim: SimulateConfig) -> Any:
    """The :class:`~adloco.plan.sim.Setup` a config and its ``simulate`` section describe."""
    from adloco import netmodel
    from adloco.plan.sim import Device, Failures, Setup
    from adloco.profile import AUTO, StepProfile

    a = cfg.algorithm
    spec = sim.model if sim.model is not None else cfg.model.name
    field = "simulate.model" if sim.model is not None else "model.name"
    n_params = parameters(spec, cfg.data.tokenizer, field)
    rows = cfg.batch.initial
    devices = [
        k
        for k, given in (
            ("simulate.step_s", sim.step_s is not None),
            ("simulate.tokens_per_s", sim.tokens_per_s is not None),
            ("runtime.profile", cfg.runtime.profile not in (None, AUTO)),
        )
        if given
    ]
    if len(devices) != 1:
        raise UserError(
            "config: simulate: the device is "
            + ("not given" if not devices else f"given {len(devices)} times ({', '.join(devices)})")
            + ": set one of simulate.step_s (seconds a step), simulate.tokens_per_s or runtime.profile (a "
            "profile adloco profile wrote)"
        )
    if sim.step_s is not None:
        device = Device.of_step(sim.step_s, rows)
    elif sim.tokens_per_s is not None:
        device = Device.of_step(rows * cfg.data.seq_len / sim.tokens_per_s, rows)
    else:
        prof = StepProfile.load(
            cfg.runtime.profile, where=f"config: runtime.profile = {cfg.runtime.profile!r}"
        )
        device = Device(prof, rows, cfg.switch.b_max or prof.b_max or rows)
    net = cfg.network
    model = netmodel.network(
        net.bandwidth,
        net.latency,
        net.upload,
        net.sites if len(net.sites) > 1 else [],
        net.site_bandwidth,
        net.site_latency,
        sim.link_speeds,
    )
    failures = Failures(
        sim.mtbf_s,
        sim.restart_s,
        sim.recovery,
        cfg.elastic.checkpoint_every,
        sim.checkpoint_s,
        tuple(sim.joins),
    )
    return Setup(
        a.method,
        a.workers,
        n_params,
        device,
        model,
        a.inner_steps,
        a.trainers if a.method == "adloco" else 1,
        cfg.comm,
        cfg.batch,
        tuple(sim.speeds),
        cfg.runtime.balance,
        sim.ddp_overlap,
        a.rounds,
        failures,
        a.seed,
        cfg.outer.optimizer == "nesterov",
        cfg.sync,
    )


def command(args: argparse.Namespace) -> int:
    """``adloco simulate``: read, price, print; write --json and --plots whole or not at all."""
    from adloco.config import load_yaml, resolve
    from adloco.config.load import parse_override

    mine: list[str] = []
    rest: list[str] = []
    for text in args.overrides:
        (mine if text.strip().startswith("simulate.") else rest).append(text)
    raw = load_yaml(args.config).get("simulate") if args.config is not None else None
    picked = []
    for text in mine:
        path, eq, value = text.partition("=")
        if not eq:
            raise UserError(f"--set {text!r}: must look like section.key=value")
        import yaml

        try:
            parsed = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            parsed = value
        from adloco.config.load import RawText

        picked.append((path.strip().split(".", 1)[1], RawText(value.strip(), parsed)))
    sim = read_section(raw, picked, f"config file {args.config!r}" if args.config else "config")
    for text in rest:
        parse_override(text)  # a malformed one is refused before anything is priced
    cfg = resolve(args.config, rest, planning=True)
    json_out = _target(args.json, "--json", folder=False)
    plots_out = _target(args.plots, "--plots", folder=True)
    from adloco.plan.sim import simulate

    s = setup(cfg, sim)
    result = simulate(s)
    text = table(result, cfg)
    if json_out is not None:
        _write_atomic(json_out, json.dumps(result.to_dict(), indent=1) + "\n")
    if plots_out is not None:
        from adloco.plan import plots

        plots.draw(s, sim, plots_out)
    sys.stdout.write(text)
    if json_out is not None:
        print(f"numbers: {json_out}")
    if plots_out is not None:
        print(f"plots: {plots_out}")
    return 0


def _target(value: str | None, flag: str, folder: bool) -> Path | None:
    if value is None:
        return None
    path = Path(value)
    if folder:
        if path.exists() and not path.is_dir():
            raise UserError(f"{flag} {value!r}: a file, not a folder")
        if not path.parent.is_dir():
            raise UserError(f"{flag} {value!r}: its parent folder does not exist")
        return path
    if path.is_dir():
        raise UserError(f"{flag} {value!r}: a folder, not a file")
    if not path.parent.is_dir():
        raise UserError(f"{flag} {value!r}: its folder does not exist")
    return path


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"{str(path)!r}: cannot be written ({exc.strerror})") from None


def _rate(bps: float) -> str:
    bits = 8 * bps
    for div, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if bits >= div:
            return f"{bits / div:.3g} {unit}"
    return f"{bits:.3g} bit/s"


def _bytes(n: float) -> str:
    for div, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.0f} B"


def _secs(t: float) -> str:
    if t >= 3600:
        return f"{t / 3600:.2f} h"
    if t >= 60:
        return f"{t / 60:.1f} min"
    return f"{t:.3g} s"


def links(net: Any) -> str:
    """The links in words."""
    from adloco import netmodel

    if isinstance(net, netmodel.Link):
        return f"{_rate(net.bandwidth)} each, {net.latency * 1e3:g} ms a hop"
    parts = [
        f"{_rate(net.bandwidth)} down",
        f"{_rate(net.upload or net.bandwidth)} up",
        f"{net.latency * 1e3:g} ms",
    ]
    if net.link_speeds:
        parts.append(f"link factors {list(net.link_speeds)}")
    if len(net.sites) > 1:
        parts.append(
            f"{len(net.sites)} sites ({', '.join(map(str, net.sites))} workers) joined by "
            f"{_rate(net.site_bandwidth or 0)}, {net.site_latency * 1e3:g} ms"
        )
    return ", ".join(parts)


def table(result: Any, cfg: Any) -> str:
    """The numbers as a two-column table (the same on a terminal and through a pipe)."""
    from adloco.models.sizing import count

    s, r, t = result.setup, result.round, result.timeline
    idle = r.idle()
    worst = max(idle, key=lambda w: (idle[w], -w))
    wire = s.wire.dtype + (f", {s.sync.fragments} fragments" if s.sync.fragments > 1 else "")
    wire += f", overlap {s.sync.overlap}" if s.sync.overlap != "none" else ""
    trainers = f", {s.trainers} trainers" if s.method == "adloco" else ""
    rows = [
        (
            "run",
            f"{s.method}, {s.workers} workers{trainers}, {count(s.parameters)} parameters, H = {s.inner_steps}",
        ),
        ("wire", wire),
        ("links", links(s.net)),
        ("device", f"{_secs(s.device.step_seconds(s.device.rows))} an inner step of {s.device.rows} rows"),
        (
            "round",
            f"{_secs(r.seconds)}: compute {_secs(max(r.compute.values()))}, communication {_secs(r.comm_s)}",
        ),
        ("bytes per round", f"{_bytes(r.bytes)} over all links"),
        ("compute utilization", f"{100 * r.utilization:.1f}%"),
        (
            "idle share per worker",
            f"mean {100 * sum(idle.values()) / len(idle):.1f}%, most {100 * idle[worst]:.1f}% (worker {worst})",
        ),
    ]
    f = s.failures
    if f.mtbf_s is not None or f.joins:
        what = f"MTBF {_secs(f.mtbf_s)} a worker, " if f.mtbf_s is not None else ""
        rows.append(("failures", f"{what}{f.recovery} recovery, {_secs(f.restart_s)} each"))
    done = f"{t.rounds} of {s.rounds} rounds" + (" (stopped: failures outpace rounds)" if t.stalled else "")
    rows.append(("on the clock", f"{done} in {_secs(t.wall_s)}"))
    rows.append(("goodput", f"{100 * t.goodput:.1f}% (useful compute over the machines' time)"))
    if f.mtbf_s is not None or f.joins:
        rows.append(
            (
                "failures, restarts",
                f"{t.failures} failures, {t.restarts} restarts, {t.rounds_lost} rounds lost, {t.joins} joins",
            )
        )
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k:<{width}}  {v}\n" for k, v in rows)
