"""What ``adloco bench`` writes once its runs are done, and again with ``--report-only``: the plan of
its report (variants with their settings and runs, the grids, what failed), ``report.md`` with its
plots (:func:`write_bench`, from the tables of :mod:`adloco.report.markdown`) and ``results.json``
(the plan with every finished run's figures and each variant's aggregates over the seeds)."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adloco import events
from adloco.bench.grid import SELECT, Setting, Task, method_of
from adloco.bench.grid import owner as grid_owner
from adloco.bench.runner import Bench
from adloco.errors import UserError
from adloco.report import results
from adloco.report.markdown import (
    FIGURES,
    _one,
    _sim_sentence,
    _table,
    _theorem1_note,
    _value,
    _what,
    aggregate,
    cell,
    default_target,
)
from adloco.report.plots import draw
from adloco.report.results import Run, reach
from adloco.telemetry.progress import fmt_bytes

# -- the results plan and results.json ---------------------------------------------------------------


def report_only(args: argparse.Namespace, argv: list[str]) -> int:
    """``--report-only``: the report of a finished bench again, priced and targeted anew."""
    if args.bandwidth is not None and args.bandwidth <= 0:
        raise UserError(f"--bandwidth {args.bandwidth}: must be > 0 (bytes per second)")
    if args.latency is not None and args.latency < 0:
        raise UserError(f"--latency {args.latency}: must be >= 0 (seconds)")
    source = Path(args.report_only)
    plan = read_results(source)
    out = Path(args.out) if args.out else source
    if out.resolve() != source.resolve() and out.exists() and any(out.iterdir()):
        raise UserError(f"--out {str(out)!r}: exists and is not empty (nothing is overwritten)")
    plan["reported_by"] = "adloco " + shlex.join(argv)
    report = _finish(plan, out, args)
    print(f"report: {report}")
    return 0


def _entry(t: Task) -> dict[str, Any]:
    """A run as the report's plan holds it (paths absolute until written)."""
    return {
        "seed": t.seed,
        "name": t.name,
        "status": t.status,
        "exit_code": t.exit_code,
        "folder": t.folder,
        "seconds": round(t.seconds, 3),
        "started": t.wall[0] or None,
        "finished": t.wall[1] or None,
        **({"stderr_tail": t.lines} if t.status != "ok" else {}),
    }


def _plan(bench: Bench, todo: list[tuple[str, list[str]]], command: str) -> dict[str, Any]:
    """What the report says, before any figure: variants with their settings and runs, the grids,
    what failed. ``results.json`` is this plus the figures, so ``--report-only`` can rebuild it."""
    args, settings, tasks = bench.args, bench.settings, bench.tasks
    grids: dict[str, list[Setting]] = settings["grids"]
    seeds: list[int] = settings["seeds"]
    variants = []
    derived = settings.get("derived", {})
    for name, _ in todo:
        owner = grid_owner(name, settings)
        grid = grids[owner]
        chosen = grid[0] if len(grid) == 1 else bench.chosen.get(owner)
        parent = derived.get(name, {}).get("from")
        start = ""
        if parent is not None:  # what it starts from: its parent's choice and its own settings
            pins = ", ".join(derived[name]["sets"])
            start = f"{parent}'s" + (f" + {pins}" if pins else "") + (": " if owner == name else "")
        if chosen is None:
            text = "no setting finished"
        elif parent is not None and owner != name:
            text = start + (f" ({chosen.text(len(grid))})" if len(grid) > 1 else "")
        elif len(grid) == 1:
            text = chosen.text()
        else:
            text = start + ("AdLoCo's: " if owner != name else "") + chosen.text(len(grid))
        mine = [t for t in tasks if t.variant == name and (t.grid is None or t.setting is chosen)]
        mine.sort(key=lambda t: seeds.index(t.seed))
        variants.append(
            {
                "name": name,
                "method": method_of(name, settings),
                "setting": None if chosen is None else chosen.values,
                "setting_index": None if chosen is None or len(grid) == 1 else chosen.index,
                "setting_text": text,
                "seeds": list(seeds),
                "runs": [_entry(t) for t in mine],
            }
        )
    grid_plan = {}
    for m, grid in grids.items():
        if len(grid) == 1 or m not in dict(todo):
            continue
        grid_plan[m] = [
            {
                "index": t.setting.index,
                "setting": t.setting.values,
                "setting_text": t.setting.text(),
                "selected": bench.chosen.get(m) is t.setting,
                **_entry(t),
            }
            for t in tasks
            if t.method == m and t.grid is not None and t.setting is not None
        ]
    order = {name: k for k, (name, _) in enumerate(todo)}
    failed = [
        {"variant": t.variant, **_entry(t)}
        for t in sorted(tasks, key=lambda t: (order[t.variant], seeds.index(t.seed), t.grid or 0))
        if t.status in ("failed", "skipped")
    ]
    return {
        "command": command,
        "budget": settings["budget"],
        "rounds": settings["rounds"],
        "seeds": seeds,
        "target_given": _given(bench),
        "jobs": args.jobs,
        "select": {
            "rule": args.select,
            "text": SELECT[args.select],
            "notes": list(bench.selection_note.values()),
            "rules": {m: r for m, r in settings.get("rules", {}).items() if len(grids.get(m, [])) > 1},
            "targets": dict(bench.targets),
        },
        "intro": _intro(bench, todo),
        "variants": variants,
        "grids": grid_plan,
        "failed": failed,
    }


def _given(bench: Bench) -> float | None:
    """The bench's target: the number given, or the perplexity a method's run set (``bench.target``
    naming a method), or None."""
    got = bench.target()
    return None if got is None or got is False else float(got)


def _intro(bench: Bench, todo: list[tuple[str, list[str]]]) -> list[str]:
    args, settings = bench.args, bench.settings
    seeds = settings["seeds"]
    grids = {m: g for m, g in settings["grids"].items() if len(g) > 1}
    lines = [
        f"{len(todo)} variants, each run on seed{'s' if len(seeds) > 1 else ''} "
        f"{', '.join(map(str, seeds))} (`algorithm.seed`) with {settings['budget']:,} training examples "
        f"(the budget; at most {settings['rounds']} rounds), the same model, data and schedule; "
        f"{len(bench.tasks)} runs, {args.jobs} at a time"
        + (", each with `runtime.threads=1`." if bench.threads else ".")
        + " Each method's settings are its preset, with the bench section's `methods` overrides and `--set`"
        " on top, unless swept.",
        "",
    ]
    if grids:
        lines += [
            "Grids: "
            + "; ".join(
                f"{m}: {' × '.join(s.partition('=')[0] for s in g[0].sets)} ({len(g)} settings)"
                for m, g in grids.items()
            )
            + f". Every setting ran on seed {seeds[0]}; each method is reported at its best setting by "
            + _rules_text(bench, grids)
            + f" on seed {seeds[0]}"
            + (
                " (runs that miss the target rank after those that reach it, by final perplexity)"
                if any(settings.get("rules", {}).get(m, args.select) != "ppl" for m in grids)
                else ""
            )
            + ", ties going to the first in grid order; that setting alone then ran on the other seeds "
            f"(its seed-{seeds[0]} run is the one it was chosen on, so that seed flatters it a little; the "
            "others do not). "
            + ("Ablations start from AdLoCo's selected setting. " if "adloco" in grids else "")
            + "".join(
                f"{name} starts from {d['from']}'s selected setting. "
                for name, d in settings.get("derived", {}).items()
            )
            + "Every setting's figures are in the grid tables below.",
            "",
        ]
        if bench.selection_note:
            lines += [" ".join(f"{note}." for note in bench.selection_note.values()), ""]
    return lines


def _rules_text(bench: Bench, grids: dict[str, Any]) -> str:
    rules = bench.settings.get("rules", {})
    by = {m: rules.get(m, bench.args.select) for m in grids}
    words: dict[str, list[str]] = {}
    for m, rule in by.items():
        text = f"**{SELECT[rule]}**"
        if rule != "ppl" and m in bench.targets:
            ref = bench.settings["target"]
            text += f" (perplexity {bench.targets[m]:.2f}" + (
                f", {ref}'s final)" if isinstance(ref, str) else ")"
            )
        words.setdefault(text, []).append(m)
    if len(words) == 1:
        return next(iter(words))
    return "; ".join(f"{', '.join(ms)}: {text}" for text, ms in words.items())


def read_results(folder: Path, who: str = "--report-only") -> dict[str, Any]:
    """The plan of a finished bench, from its results.json (paths made absolute again); ``who`` opens
    the one line said when the folder holds none."""
    path = folder / "results.json"
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
        plan["variants"] = [{"name": k, **v} for k, v in plan["variants"].items()]
        for e in [
            *(e for v in plan["variants"] for e in v["runs"]),
            *(e for rows in plan["grids"].values() for e in rows),
            *plan["failed"],
        ]:
            e["folder"] = None if e.get("folder") is None else folder / e["folder"]
        plan["intro"], plan["target_given"]  # noqa: B018 -- present in a bench's results.json
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise UserError(f"{who} {str(folder)!r}: no readable results.json of adloco bench") from None
    return plan


def _finish(plan: dict[str, Any], out: Path, args: argparse.Namespace) -> Path:
    """Load the finished runs, price them together, write report.md, plots and results.json."""
    bandwidth, latency = getattr(args, "bandwidth", None), getattr(args, "latency", None)
    loaded: dict[Path, results.Run] = {}

    def load(e: dict[str, Any]) -> results.Run | None:
        if e["status"] != "ok" or e["folder"] is None:
            return None
        if e["folder"] not in loaded:
            loaded[e["folder"]] = results.load(e["folder"], bandwidth, latency)
        return loaded[e["folder"]]

    variants = [
        Variant(
            v["name"],
            v["method"],
            v["setting_text"],
            [r for r in map(load, v["runs"]) if r is not None],
            v["seeds"],
        )
        for v in plan["variants"]
    ]
    grid_runs = {m: [load(e) for e in rows] for m, rows in plan["grids"].items()}
    if loaded:
        results.price(
            list(loaded.values()), args.compute, args.seconds_per_example, args.profile, args.fixed_share
        )
    compared = [r for v in variants for r in v.runs]
    target = args.target if args.target is not None else plan["target_given"]
    if target is None and compared:
        target = default_target(compared)
    grid_rows = {
        m: [
            GridRow(
                m,
                e["index"],
                e["setting_text"],
                run,
                "ok" if run is not None else f"failed (exit code {e['exit_code']})",
                e["selected"],
            )
            for e, run in zip(rows, grid_runs[m], strict=True)
        ]
        for m, rows in plan["grids"].items()
    }

    def rel(p: Path | None) -> str | None:
        return None if p is None else os.path.relpath(p, out)

    failed = [
        Failed(
            f["variant"], f["seed"], f["status"], f["exit_code"], rel(f["folder"]), f.get("stderr_tail", [])
        )
        for f in plan["failed"]
    ]
    again = plan.get("reported_by")
    report = write_bench(
        variants,
        out,
        target if target is not None else math.nan,
        intro=(
            [f"Reported again by `{again}`: the same runs and selection, priced and targeted as below.", ""]
            if again
            else []
        )
        + plan["intro"],
        grids=grid_rows,
        failed=failed,
        command=plan["command"],
        first_seed=plan["seeds"][0],
    )
    # results.json: the plan with every finished run's figures and each variant's aggregates
    first = next(iter(loaded.values()), None)

    def written(e: dict[str, Any]) -> dict[str, Any]:
        run = load(e)
        e = {**e, "folder": rel(e["folder"])}
        if run is not None and target is not None:
            e.update(figures(run, target), run=rel(run.path))
        return e

    document = {
        **plan,
        "target": target,
        "metric": first.metric if first else "val_ppl",
        "compute": {
            "mode": first.compute if first else args.compute,
            "seconds_per_example": first.seconds_per_example if first else args.seconds_per_example,
            "source": first.compute_note if first else "",
            "profile": first.profile.to_dict() if first and first.profile else None,
        },
        "network": {"bandwidth": first.bandwidth, "latency": first.latency} if first else None,
        "variants": {
            v["name"]: {
                **{k: x for k, x in v.items() if k != "name"},
                "runs": [written(e) for e in v["runs"]],
                "aggregate": {
                    k: (None if st is None else st.to_dict())
                    for k, st in (aggregate(var.runs, target) if var.runs and target else {}).items()
                },
                "reached": sum(results.reach(r, target) is not None for r in var.runs) if target else 0,
            }
            for v, var in zip(plan["variants"], variants, strict=True)
        },
        "grids": {m: [written(e) for e in rows] for m, rows in plan["grids"].items()},
        "failed": [written(f) for f in plan["failed"]],
    }
    (out / "results.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return report


def figures(run: Run, target: float) -> dict[str, Any]:
    """A run's figures for ``results.json``: final metric, totals and what reaching the target took."""
    end = run.end
    assert end is not None
    got = reach(run, target)
    return {
        "run": run.label,
        "seed": run.seed,
        "final": events.num(run.final),
        "rounds": end.round,
        "examples": end.examples,
        "communications": end.communications,
        "bytes": end.bytes,
        "sim_s": end.sim_s,
        "to_target": None
        if got is None
        else {
            "round": got.round,
            "examples": got.examples,
            "communications": got.communications,
            "bytes": got.bytes,
            "sim_s": got.sim_s,
        },
        "wall_s": run.summary.get("wall_s"),
        "peak_memory_bytes": run.summary.get("peak_memory_bytes"),
    }


# -- report.md ------------------------------------------------------------------------------------


@dataclass
class Variant:
    """A compared variant: its finished runs (one per seed) at its one setting."""

    name: str
    method: str
    setting: str  # the setting in words ("preset"; "outer.lr=0.5, outer.momentum=0.9 (#1 of 6)")
    runs: list[Run]
    seeds: list[int]  # the seeds it was to run on


@dataclass
class GridRow:
    """One setting of a method's grid, on the first seed."""

    method: str
    index: int
    setting: str
    run: Run | None  # None: it failed
    status: str  # "ok" or why not
    selected: bool


@dataclass
class Failed:
    """A run that failed (or was never started because what it needed failed)."""

    variant: str
    seed: int
    status: str  # failed | skipped
    exit_code: int | None
    folder: str | None  # where its bench-failure.txt is, relative to the bench folder
    lines: list[str]  # the last lines of its stderr, or why it was skipped


def write_bench(
    variants: list[Variant],
    out: Path,
    target: float,
    *,
    intro: list[str],
    grids: dict[str, list[GridRow]] | None = None,
    failed: list[Failed] | None = None,
    command: str | None = None,
    first_seed: int = 0,
) -> Path:
    """``out/report.md`` and ``out/plots`` of a bench: the variants' figures over seeds (mean, min–max,
    95% t-interval), mean curves with min–max bands, failed runs, the grid and every run."""
    out.mkdir(parents=True, exist_ok=True)
    runs = [r for v in variants for r in v.runs]
    lines = ["# adloco bench", ""]
    if command:
        lines += ["Made by:", "", "```bash", command, "```", ""]
    lines += intro
    if runs:
        what = _what(runs)
        several = any(len(v.runs) > 1 for v in variants)
        lines += [
            f"Target {what}: **{target:.2f}**. Validation {what} is trainer 0's at each evaluation. "
            + _sim_sentence(runs),
            "",
        ]
        if several:
            lines += [
                "Each cell: the mean over the seeds [min–max] ±h, h the half-width of the 95% Student-t "
                "interval of the mean (t_{0.975, n−1} · s/√n, s the standard deviation over the n seeds; "
                "from 3 seeds on). To-target figures are over the seeds that reached the target.",
                "",
            ]
        head = [c.format(what=what) for _, c, _ in FIGURES]
        lines += [
            "| variant | method | setting | seeds | " + " | ".join(head) + " |",
            "|---|---|---|---|" + "---|" * len(head),
        ]
        for v in variants:
            seeds = f"{len(v.runs)}" if len(v.runs) == len(v.seeds) else f"{len(v.runs)} of {len(v.seeds)}"
            if not v.runs:
                lines.append(
                    f"| {v.name} | {v.method} | {v.setting} | 0 of {len(v.seeds)} |" + " — |" * len(head)
                )
                continue
            agg = aggregate(v.runs, target)
            cells = [
                cell(agg[key], kind, len(v.runs) if key.endswith("_to_target") else None)
                for key, _, kind in FIGURES
            ]
            lines.append(f"| {v.name} | {v.method} | {v.setting} | {seeds} | " + " | ".join(cells) + " |")
        drawn = draw(runs, out / "plots", target, groups=[(v.name, v.runs) for v in variants if v.runs])
        lines += ["", "Plots:", ""] + [f"![{n}](plots/{n})" for n in drawn] + [""]
        if several:
            lines += [
                "A variant of several seeds is drawn as its mean curve with a min–max band. Seeds of one "
                "budget can end at different rounds, examples, bytes or times, so each seed's curve is "
                "interpolated linearly onto a common x grid (the union of the seeds' x values) and averaged "
                "only where every seed has data: up to the shortest seed's last point, never extrapolated. "
                "Beyond it each seed's own curve goes on as a thin dashed line. The per-run plots (requests, "
                "trainers, allocation, batch) show each variant's first seed.",
                "",
            ]
        lines += _theorem1_note(runs)
    else:
        lines += ["No run finished: nothing to compare.", ""]
    if failed:
        lines += [
            "## Runs that failed",
            "",
            "Left out of every figure above. Each folder holds `bench-failure.txt` (the exit code and the "
            "last lines of its stderr); the whole output is in `logs/`.",
            "",
            "| variant | seed | status | exit code | folder | last line of stderr |",
            "|---|---|---|---|---|---|",
        ]
        for f in failed:
            last = next((x for x in reversed(f.lines) if x.strip()), "")
            last = last.strip().replace("|", "\\|")
            code = "—" if f.exit_code is None else str(f.exit_code)
            folder = f"`{f.folder}`" if f.folder else "—"
            lines.append(f"| {f.variant} | {f.seed} | {f.status} | {code} | {folder} | {last} |")
        lines.append("")
    for method, rows in (grids or {}).items():
        grid_runs = [row.run for row in rows if row.run is not None]
        what = _what(grid_runs) if grid_runs else "perplexity"
        lines += [
            f"## Grid of {method} (seed {first_seed})",
            "",
            f"| # | setting | final {what} | bytes → target | bytes | sim. time → target | sim. time | |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            mark = "**selected**" if row.selected else ("" if row.status == "ok" else row.status)
            if row.run is None or row.run.end is None:
                lines.append(f"| {row.index} | {row.setting} | — | — | — | — | — | {mark} |")
                continue
            got = reach(row.run, target)
            end = row.run.end
            lines.append(
                f"| {row.index} | {row.setting} | {_value(row.run.final)} | "
                f"{fmt_bytes(got.bytes) if got else 'not reached'} | {fmt_bytes(end.bytes)} | "
                f"{_one(got.sim_s, 'seconds') if got else 'not reached'} | {_one(end.sim_s, 'seconds')} | {mark} |"
            )
        lines.append("")
    if runs:
        lines += ["## Every run", "", *_table(runs, target), ""]
    report = out / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return report
