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

from adloco.config import load_yaml, parse_override, resolve
from adloco.config.load import yaml_value
from adloco.errors import UserError
from adloco.library.settings import METHODS

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
BENCH_KEYS = ("budget", "target", "seeds", "methods", "sweep", "select", "variants")


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
    args: argparse.Namespace, bench: dict[str, Any], where: str, derived: dict[str, dict[str, Any]]
) -> dict[str, dict[str, list[str]]]:
    """{method or derived variant: {key: [--set value texts]}}: the config's bench.sweep, then --sweep for
    every method (a derived variant's grid is the config's alone)."""
    per = bench.get("sweep") or {}
    names = [*METHODS, *derived]
    if not isinstance(per, dict) or set(per) - set(names):
        raise UserError(f"{where}: bench.sweep: keys must be among {', '.join(names)}")
    out: dict[str, dict[str, list[str]]] = {m: {} for m in names}
    for m, grid in per.items():
        if not isinstance(grid, dict):
            raise UserError(f"{where}: bench.sweep.{m}: a mapping of section.key to a list of values")
        for k, values in grid.items():
            vals = values if isinstance(values, list) else [values]
            if not vals:
                raise UserError(f"{where}: bench.sweep.{m}.{k}: no values")
            out[m][_key(str(k), f"{where}: bench.sweep.{m}")] = [yaml_value(v) for v in vals]
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


def _derived(bench: dict[str, Any], where: str) -> dict[str, dict[str, Any]]:
    """bench.variants: {name: {"from": method, "sets": [--set texts]}}, each a method's selected setting
    with settings of its own on top (and, with a bench.sweep of its own, a grid tuned from there)."""
    given = bench.get("variants") or {}
    if not isinstance(given, dict):
        raise UserError(f"{where}: bench.variants: a mapping of names to {{from: METHOD, set: {{...}}}}")
    out: dict[str, dict[str, Any]] = {}
    for name, spec in given.items():
        name = str(name)
        here = f"{where}: bench.variants.{name}"
        if (
            name in METHODS
            or name in [f"adloco-{a}" for a in ABLATIONS]
            or not name.replace("-", "").isalnum()
        ):
            raise UserError(
                f"{here}: a new name of letters, digits and '-' (not a method's or an ablation's)"
            )
        if not isinstance(spec, dict) or set(spec) - {"from", "set"} or spec.get("from") not in METHODS:
            raise UserError(f"{here}: holds from (one of {', '.join(METHODS)}) and set (section.key: value)")
        pins = spec.get("set") or {}
        if not isinstance(pins, dict):
            raise UserError(f"{here}.set: a mapping of section.key to a value")
        out[name] = {
            "from": spec["from"],
            "sets": [f"{_key(str(k), here + '.set')}={yaml_value(v)}" for k, v in pins.items()],
        }
    return out


def _rules(bench: dict[str, Any], where: str, names: Sequence[str], default: str) -> dict[str, str]:
    """bench.select: {variant: rule}, the rule of each grid's choice (others: --select)."""
    given = bench.get("select") or {}
    if not isinstance(given, dict) or set(given) - set(names) or set(given.values()) - set(SELECT):
        raise UserError(
            f"{where}: bench.select: a mapping of variants ({', '.join(names)}) to a rule "
            f"({', '.join(SELECT)})"
        )
    return {m: str(given.get(m, default)) for m in names}


def owner(name: str, settings: dict[str, Any]) -> str:
    """Whose grid gives variant ``name`` its setting: its own, or (an ablation, a derived variant without
    a grid of its own) the method it starts from."""
    derived = settings.get("derived", {})
    if name in derived:
        return name if len(settings["grids"][name]) > 1 else derived[name]["from"]
    return "adloco" if name.startswith("adloco-") else name


def method_of(name: str, settings: dict[str, Any]) -> str:
    """The ``algorithm.method`` variant ``name`` runs."""
    derived = settings.get("derived", {})
    if name in derived:
        return str(derived[name]["from"])
    return "adloco" if name.startswith("adloco-") else name


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
    derived = _derived(bench, where)
    keys = _grid_keys(args, bench, where, derived)
    out: list[tuple[str, list[str]]] = []
    methods = _split(args.methods, [*METHODS, *derived], "methods")
    ablations = _split(args.ablations, ABLATIONS, "ablations")
    if not methods and not ablations:
        raise UserError("--methods: nothing to run")

    def sets(method: str) -> list[str]:
        method = derived[method]["from"] if method in derived else method
        own = [f"{k}={yaml_value(v)}" for k, v in (per_method.get(method) or {}).items()]
        return [f"algorithm.method={method}", *own, *args.overrides, f"algorithm.budget={int(budget)}"]

    out += [(m, sets(m)) for m in methods]
    out += [(f"adloco-{a}", sets("adloco") + ABLATIONS[a]) for a in ablations]
    # a derived variant starts from its parent's one setting, or from its grid's choice: the parent's
    # grid is known even where the parent does not run (as AdLoCo's for ablations)
    parents = [derived[m]["from"] for m in methods if m in derived]
    owners = [*methods, *(["adloco"] if ablations else []), *parents]
    grids: dict[str, list[Setting]] = {}
    for m in dict.fromkeys(owners):
        names = list(keys[m])
        combos = itertools.product(*(keys[m][k] for k in names))
        grids[m] = [
            Setting(i, [f"{k}={v}" for k, v in zip(names, c, strict=True)]) for i, c in enumerate(combos)
        ]
    for name in methods:
        parent = derived[name]["from"] if name in derived else None
        if parent is not None and parent not in methods and len(grids[parent]) > 1:
            raise UserError(
                f"--methods {args.methods!r}: {name} starts from {parent}'s selected setting, so with a "
                f"grid for {parent}, --methods must include {parent}"
            )
    if ablations and len(grids["adloco"]) > 1 and "adloco" not in methods:
        raise UserError(
            "--ablations: they start from AdLoCo's selected setting, so with a grid for adloco, "
            "--methods must include adloco"
        )
    # Every variant runs until the budget: enough rounds for the slowest consumer (a constant batch of
    # batch.initial on every worker), the same for all, so learning-rate schedules match.
    needed = 1
    optimizers: set[str] = set()  # the inner optimizers of every variant at every setting, presets' included
    run_methods: set[str] = set()  # the methods (algorithm.method) its variants run
    for name, s in out:
        base = "adloco" if name.startswith("adloco-") else name
        if name in derived:  # each of its parent's settings, its own sets, each setting of its own grid
            own = derived[name]["sets"]
            points = [
                ([*p.sets, *own, *g.sets], g) for p in grids[derived[name]["from"]] for g in grids[name]
            ]
        elif base != name:  # an ablation: each of AdLoCo's settings, then the ablation's sets
            points = [([*g.sets, *ABLATIONS[name.removeprefix("adloco-")]], g) for g in grids[base]]
        else:
            points = [(g.sets, g) for g in grids[name]]
        for full, g in points:
            try:
                c = resolve(None, [*s[: len(sets(base))], *full], base=raw)
            except UserError as exc:
                label = f"variant {name}" + (f" at {', '.join(full)}" if full else "")
                raise UserError(f"{label}: {exc}") from None
            if base == name or not g.values:  # a grid's keys, else the bench section's (a variant's) pins
                pins = derived[name]["sets"] if name in derived else list(per_method.get(name) or {})
                shown = [k.partition("=")[0] for k in g.sets] or [str(k).partition("=")[0] for k in pins]
                g.values = {k: _get(c, k) for k in shown}
            optimizers.add(str(c.inner.optimizer))
            run_methods.add(c.algorithm.method)
            per_round = c.algorithm.workers * c.algorithm.inner_steps * c.batch.initial
            needed = max(needed, c.algorithm.rounds, -(-int(budget) // per_round))
    out = [(name, [*s, f"algorithm.rounds={needed}"]) for name, s in out]
    target = args.target if args.target is not None else bench.get("target")
    if isinstance(target, str) and target not in methods:
        raise UserError(
            f"{where}: bench.target = {target!r}: a perplexity, or one of --methods ({', '.join(methods)}): "
            "its selected setting's final perplexity on the first seed"
        )
    names = [*methods, *(f"adloco-{a}" for a in ablations)]
    settings = {
        "raw": raw,
        "budget": int(budget),
        "target": target if target is None or isinstance(target, str) else float(target),
        "seeds": seeds,
        "grids": grids,
        "rounds": needed,
        "optimizers": optimizers,
        "methods": run_methods,
        "derived": {k: v for k, v in derived.items() if k in methods},
        "rules": _rules(bench, where, names, getattr(args, "select", "ppl")),
    }
    ref, rules = settings["target"], _rules(bench, where, names, getattr(args, "select", "ppl"))
    if isinstance(ref, str) and rules.get(ref, "ppl") != "ppl" and len(grids.get(ref, [])) > 1:
        raise UserError(
            f"{where}: bench.target = {ref!r} with bench.select.{ref} = {rules[ref]!r}: {ref}'s "
            "grid would rank by the target its own choice sets; select it by ppl"
        )
    return settings, out


def _get(cfg: Any, key: str) -> Any:
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


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
    wait: str | None = None  # a derived variant with a grid: the method whose selection it starts from
    then: list[str] = field(default_factory=list)  # ... and its own sets, added after that selection


def plan(settings: dict[str, Any], todo: list[tuple[str, list[str]]]) -> list[Task]:
    """Every run, in the order they start when they can: the first seed of every variant (the grids'
    settings included), then each further seed of every variant; a further seed of a method with a grid,
    and an ablation of an AdLoCo with a grid, waits for that grid's selection."""
    grids: dict[str, list[Setting]] = settings["grids"]
    seeds: list[int] = settings["seeds"]
    derived: dict[str, dict[str, Any]] = settings.get("derived", {})
    tasks: list[Task] = []
    for s in seeds:
        for name, sets in todo:
            ablation = name.startswith("adloco-") and name not in derived  # a derived variant may start so
            own = owner(name, settings)
            base, rounds = sets[: len(sets) - 1], sets[-1:]
            extra = ABLATIONS[name.removeprefix("adloco-")] if ablation else []
            if ablation:
                base = base[: len(base) - len(extra)]
            elif name in derived and own != name:  # like an ablation of the method it starts from
                extra = [*derived[name]["sets"], *grids[name][0].sets]
            grid = grids[own]
            if own == name and name in derived:  # its own grid, once its parent's setting is chosen
                wait, then = derived[name]["from"], derived[name]["sets"]
                if s == seeds[0]:
                    tasks += [
                        Task(name, own, s, base, rounds, grid=g.index, setting=g, wait=wait, then=then)
                        for g in grid
                    ]
                else:
                    tasks.append(Task(name, own, s, base, rounds, wait=wait, then=then))
            elif len(grid) == 1:
                tasks.append(Task(name, own, s, base, [*extra, *rounds], setting=grid[0]))
            elif s == seeds[0] and own == name:
                tasks += [Task(name, own, s, base, rounds, grid=g.index, setting=g) for g in grid]
            else:
                tasks.append(Task(name, own, s, base, [*extra, *rounds]))
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
