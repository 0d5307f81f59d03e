"""What ``adloco bench`` runs: the methods and ablations it knows, the bench section of its config
file, every variant's ``--set`` overrides checked at every setting of its method's grid, the runs
(:class:`Task`) in the order they start, and the choice of a grid's best setting (:func:`select`).
Nothing here starts a process (:mod:`adloco.bench.runner` does)."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from adloco.config import load_yaml, parse_override, resolve
from adloco.errors import UserError
from adloco.settings import METHODS

ABLATIONS: dict[str, list[str]] = {
    "no-adaptive": ["batch.test=none", "batch.statistics=false"],
    "no-merge": ["merge.policy=none"],
    "no-switch": ["switch.mode=cap"],
}
SELECT: dict[str, str] = {
    "ppl": "the lowest final validation perplexity",
    "time": "the least simulated time to the target",
    "bytes": "the fewest bytes communicated to the target",
}
# set by the bench for every run: not for --sweep
RESERVED = {
    "algorithm.method",
    "algorithm.seed",
    "algorithm.budget",
    "algorithm.rounds",
    "logging.name",
    "logging.out_dir",
    "logging.progress",
}
BENCH_KEYS = ("budget", "target", "seeds", "methods", "sweep")


@dataclass
class Setting:
    """One point of a method's grid."""

    index: int
    sets: list[str]  # --set texts
    values: dict[str, Any] = field(default_factory=dict)  # key -> its resolved value

    def text(self, of: int = 1) -> str:
        words = ", ".join(f"{k}={v}" for k, v in self.values.items()) or "preset"
        return f"{words} (#{self.index} of {of})" if of > 1 else words


def _split(text: str, allowed: Any, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    for x in items:
        if x not in allowed:
            raise UserError(f"--{what} {text!r}: {x!r} is not one of {', '.join(allowed)}")
    if len(set(items)) != len(items):
        raise UserError(f"--{what} {text!r}: a variant is named twice")
    return items


def _seeds(given: Any, where: str) -> list[int]:
    items = [x.strip() for x in given.split(",")] if isinstance(given, str) else list(given)
    try:
        seeds = [int(x) for x in items if str(x).strip() != ""]
    except (TypeError, ValueError):
        raise UserError(f"{where} {given!r}: seeds are integers, e.g. 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds) or any(not 0 <= s < 2**31 for s in seeds):
        raise UserError(f"{where} {given!r}: distinct integers in [0, 2**31), e.g. 0,1,2")
    return seeds


def _key(key: str, where: str) -> str:
    key = key.strip()
    parse_override(f"{key}=0")  # section.key or one line of error
    if key in RESERVED:
        raise UserError(f"{where}: {key} is set by the bench for every run (seeds: --seeds), not swept")
    return key


def _grid_keys(
    args: argparse.Namespace, bench: dict[str, Any], where: str
) -> dict[str, dict[str, list[str]]]:
    """{method: {key: [--set value texts]}}: the config's bench.sweep, then --sweep for every method."""
    per = bench.get("sweep") or {}
    if not isinstance(per, dict) or set(per) - set(METHODS):
        raise UserError(f"{where}: bench.sweep: keys must be among {', '.join(METHODS)}")
    out: dict[str, dict[str, list[str]]] = {m: {} for m in METHODS}
    for m, grid in per.items():
        if not isinstance(grid, dict):
            raise UserError(f"{where}: bench.sweep.{m}: a mapping of section.key to a list of values")
        for k, values in grid.items():
            vals = values if isinstance(values, list) else [values]
            if not vals:
                raise UserError(f"{where}: bench.sweep.{m}.{k}: no values")
            out[m][_key(str(k), f"{where}: bench.sweep.{m}")] = [_yaml_value(v) for v in vals]
    for text in getattr(args, "sweep", None) or []:
        if "=" not in text:
            raise UserError(f"--sweep {text!r}: must look like section.key=v1,v2,...")
        k, _, raw = text.partition("=")
        vals = [v.strip() for v in raw.split(",")]
        if not any(vals) or not all(vals):
            raise UserError(f"--sweep {text!r}: give comma-separated values, e.g. outer.lr=0.3,0.5,0.7")
        k = _key(k, f"--sweep {text!r}")
        for m in METHODS:
            out[m][k] = vals
    return out


def variants(args: argparse.Namespace) -> tuple[dict[str, Any], list[tuple[str, list[str]]]]:
    """(bench settings, [(variant name, --set overrides at its preset)]); every variant's config is
    checked here, at every setting of its grid (``settings["grids"]``, per method)."""
    where = f"config file {args.config!r}"
    raw = load_yaml(args.config) if args.config else {}
    bench = raw.pop("bench", None) or {}
    if not isinstance(bench, dict) or set(bench) - set(BENCH_KEYS):
        raise UserError(f"{where}: the bench section holds {', '.join(BENCH_KEYS)} only")
    per_method = bench.get("methods") or {}
    if not isinstance(per_method, dict) or set(per_method) - set(METHODS):
        raise UserError(f"{where}: bench.methods: keys must be among {', '.join(METHODS)}")
    budget = args.budget if args.budget is not None else bench.get("budget")
    if budget is None or int(budget) < 1:
        raise UserError(
            "--budget: a positive number of training examples is needed (or bench.budget in the config)"
        )
    seeds_arg = getattr(args, "seeds", None)
    if seeds_arg is not None:
        seeds = _seeds(seeds_arg, "--seeds")
    elif bench.get("seeds") is not None:
        seeds = _seeds(bench["seeds"], f"{where}: bench.seeds")
    else:
        seeds = [resolve(None, args.overrides, base=raw).algorithm.seed]
    keys = _grid_keys(args, bench, where)
    out: list[tuple[str, list[str]]] = []
    methods = _split(args.methods, METHODS, "methods")
    ablations = _split(args.ablations, ABLATIONS, "ablations")
    if not methods and not ablations:
        raise UserError("--methods: nothing to run")

    def sets(method: str) -> list[str]:
        own = [f"{k}={_yaml_value(v)}" for k, v in (per_method.get(method) or {}).items()]
        return [f"algorithm.method={method}", *own, *args.overrides, f"algorithm.budget={int(budget)}"]

    out += [(m, sets(m)) for m in methods]
    out += [(f"adloco-{a}", sets("adloco") + ABLATIONS[a]) for a in ablations]
    owners = [*methods, *(["adloco"] if ablations else [])]
    grids: dict[str, list[Setting]] = {}
    for m in dict.fromkeys(owners):
        names = list(keys[m])
        combos = itertools.product(*(keys[m][k] for k in names))
        grids[m] = [
            Setting(i, [f"{k}={v}" for k, v in zip(names, c, strict=True)]) for i, c in enumerate(combos)
        ]
    if ablations and len(grids["adloco"]) > 1 and "adloco" not in methods:
        raise UserError(
            "--ablations: they start from AdLoCo's selected setting, so with a grid for adloco, "
            "--methods must include adloco"
        )
    # Every variant runs until the budget: enough rounds for the slowest consumer (a constant batch of
    # batch.initial on every worker), the same for all, so learning-rate schedules match.
    needed = 1
    for name, s in out:
        owner = "adloco" if name.startswith("adloco-") else name
        for g in grids[owner]:
            extra = ABLATIONS[name.removeprefix("adloco-")] if owner != name else []
            try:
                c = resolve(None, [*s[: len(sets(owner))], *g.sets, *extra], base=raw)
            except UserError as exc:
                label = f"variant {name}" + (f" at {', '.join(g.sets)}" if g.sets else "")
                raise UserError(f"{label}: {exc}") from None
            if owner == name or not g.values:  # a grid's keys, else the bench section's pins
                shown = [k.partition("=")[0] for k in g.sets] or [str(k) for k in per_method.get(owner) or {}]
                g.values = {k: _get(c, k) for k in shown}
            per_round = c.algorithm.workers * c.algorithm.inner_steps * c.batch.initial
            needed = max(needed, c.algorithm.rounds, -(-int(budget) // per_round))
    out = [(name, [*s, f"algorithm.rounds={needed}"]) for name, s in out]
    target = args.target if args.target is not None else bench.get("target")
    settings = {
        "raw": raw,
        "budget": int(budget),
        "target": None if target is None else float(target),
        "seeds": seeds,
        "grids": grids,
        "rounds": needed,
    }
    return settings, out


def _get(cfg: Any, key: str) -> Any:
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


def _yaml_value(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


@dataclass
class Task:
    """One run: a variant on one seed, at a setting known now or once its method's grid is chosen."""

    variant: str
    method: str  # whose grid gives its setting (adloco, for ablations)
    seed: int
    base: list[str]  # the variant's --set overrides before its setting
    extra: list[str]  # after it: an ablation's
    grid: int | None = None  # a grid run: its setting's index
    setting: Setting | None = None  # None: waits for the method's selection
    name: str = ""
    status: str = "queued"  # queued | running | ok | failed | skipped
    exit_code: int | None = None
    folder: Path | None = None  # its run directory (or the folder of its failure note)
    run: Any = None  # its results.Run once finished
    started: float = 0.0  # time.monotonic()
    seconds: float = 0.0
    wall: tuple[float, float] = (0.0, 0.0)  # started and finished, seconds since the epoch
    lines: list[str] = field(default_factory=list)  # the last lines of its stderr, or why skipped
    number: int = 0  # in the progress lines


def plan(settings: dict[str, Any], todo: list[tuple[str, list[str]]]) -> list[Task]:
    """Every run, in the order they start when they can: the first seed of every variant (the grids'
    settings included), then each further seed of every variant; a further seed of a method with a grid,
    and an ablation of an AdLoCo with a grid, waits for that grid's selection."""
    grids: dict[str, list[Setting]] = settings["grids"]
    seeds: list[int] = settings["seeds"]
    tasks: list[Task] = []
    for s in seeds:
        for name, sets in todo:
            ablation = name.startswith("adloco-")
            owner = "adloco" if ablation else name
            base, rounds = sets[: len(sets) - 1], sets[-1:]
            extra = ABLATIONS[name.removeprefix("adloco-")] if ablation else []
            if ablation:
                base = base[: len(base) - len(extra)]
            grid = grids[owner]
            if len(grid) == 1:
                tasks.append(Task(name, owner, s, base, [*extra, *rounds], setting=grid[0]))
            elif s == seeds[0] and not ablation:
                tasks += [Task(name, owner, s, base, rounds, grid=g.index, setting=g) for g in grid]
            else:
                tasks.append(Task(name, owner, s, base, [*extra, *rounds]))
    for t in tasks:
        if t.setting is not None:
            _name(t, grids)
    return tasks


def _name(t: Task, grids: dict[str, list[Setting]]) -> None:
    assert t.setting is not None
    g = f"-g{t.setting.index}" if len(grids[t.method]) > 1 and t.variant == t.method else ""
    t.name = f"{t.variant}{g}-s{t.seed}"


def select(candidates: Sequence[tuple[int, Any]], rule: str, target: float | None) -> int | None:
    """The index of the best setting by ``rule`` (:data:`SELECT`) among ``(index, results.Run or
    None)`` in grid order; a None (failed) setting is never chosen; ties: the first in grid order."""
    from adloco.report import results

    def key(run: results.Run) -> tuple[float, ...]:
        final = run.final if run.metric == "val_ppl" else -run.final
        if rule == "ppl":
            return (final,)
        if target is None:
            raise UserError(f"--select {rule}: needs a target (--target or bench.target)")
        got = results.reach(run, target)
        if got is None:
            return (1.0, final)
        return (0.0, got.sim_s if rule == "time" else float(got.bytes))

    best: tuple[tuple[float, ...], int] | None = None
    for index, run in candidates:
        if run is None:
            continue
        k = key(run)
        if best is None or k < best[0]:
            best = (k, index)
    return None if best is None else best[1]
