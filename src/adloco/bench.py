"""``adloco bench``: the methods and ablations on identical data, model, seeds and example budget.

Each variant is an ordinary run directory (its own process, so peak memory is its own), run one after
the other; then a comparison folder gets ``report.md`` and plots (:mod:`adloco.compare`).

The config file is an ordinary config for everything the variants share, plus an optional ``bench``
section: ``budget`` (training examples per variant), ``target`` (perplexity) and ``methods``, per-method
overrides (``{diloco: {outer.lr: 0.7}}``) applied on top of the method's preset; ablations start from
AdLoCo's.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from adloco.config import dump_yaml, load_yaml, resolve
from adloco.errors import UserError

METHODS = ("adloco", "diloco", "localsgd", "ddp")
ABLATIONS: dict[str, list[str]] = {
    "no-adaptive": ["batch.test=none", "batch.statistics=false"],
    "no-merge": ["merge.policy=none"],
    "no-switch": ["switch.mode=cap"],
}


def add_parser(sub: Any) -> None:
    b = sub.add_parser("bench", help="run methods and ablations on one budget, then compare them")
    b.add_argument("--config", "-c", metavar="FILE", help="shared config, with an optional `bench` section")
    b.add_argument("--set", "-s", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    b.add_argument(
        "--methods", default="adloco,diloco,localsgd,ddp", help="comma-separated: " + ", ".join(METHODS)
    )
    b.add_argument("--ablations", default="", help="comma-separated: " + ", ".join(ABLATIONS))
    b.add_argument("--budget", type=int, help="training examples per variant (default: the bench section's)")
    b.add_argument("--target", type=float, help="perplexity to reach (default: the highest final one)")
    b.add_argument("--out", help="comparison folder (default: <logging.out_dir>/bench-<timestamp>)")
    b.add_argument("--debug", action="store_true", help="show tracebacks")


def _split(text: str, allowed: Any, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    for x in items:
        if x not in allowed:
            raise UserError(f"--{what} {text!r}: {x!r} is not one of {', '.join(allowed)}")
    if len(set(items)) != len(items):
        raise UserError(f"--{what} {text!r}: a variant is named twice")
    return items


def variants(args: argparse.Namespace) -> tuple[dict[str, Any], list[tuple[str, list[str]]]]:
    """(bench settings, [(variant name, --set overrides)]); every variant's config is checked here."""
    raw = load_yaml(args.config) if args.config else {}
    bench = raw.pop("bench", None) or {}
    if not isinstance(bench, dict) or set(bench) - {"budget", "target", "methods"}:
        raise UserError(
            f"config file {args.config!r}: the bench section holds budget, target and methods only"
        )
    per_method = bench.get("methods") or {}
    if not isinstance(per_method, dict) or set(per_method) - set(METHODS):
        raise UserError(
            f"config file {args.config!r}: bench.methods: keys must be among {', '.join(METHODS)}"
        )
    budget = args.budget if args.budget is not None else bench.get("budget")
    if budget is None or int(budget) < 1:
        raise UserError(
            "--budget: a positive number of training examples is needed (or bench.budget in the config)"
        )
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
    # Every variant runs until the budget: enough rounds for the slowest consumer (a constant batch of
    # batch.initial on every worker), the same for all, so learning-rate schedules match.
    needed = 1
    for name, s in out:
        try:
            c = resolve(None, s, base=raw)
        except UserError as exc:
            raise UserError(f"variant {name}: {exc}") from None
        per_round = c.algorithm.workers * c.algorithm.inner_steps * c.batch.initial
        needed = max(needed, c.algorithm.rounds, -(-int(budget) // per_round))
    out = [(name, [*s, f"algorithm.rounds={needed}"]) for name, s in out]
    target = args.target if args.target is not None else bench.get("target")
    return {"raw": raw, "budget": int(budget), "target": target}, out


def _yaml_value(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from adloco import compare

    settings, todo = variants(args)
    shared = resolve(None, args.overrides, base=settings["raw"])
    out = Path(args.out or Path(shared.logging.out_dir) / f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {str(out)!r}: exists and is not empty (nothing is overwritten)")
    try:
        (out / "runs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {str(out)!r}: cannot be created ({exc.strerror})") from None
    (out / "shared.yaml").write_text(yaml.safe_dump(settings["raw"], sort_keys=False), encoding="utf-8")
    print(f"bench: {len(todo)} variants, {settings['budget']:,} training examples each -> {out}", flush=True)
    run_dirs = []
    for i, (name, sets) in enumerate(todo, 1):
        cmd = [sys.executable, "-m", "adloco", "train", "--config", str(out / "shared.yaml")]
        for s in ["logging.progress=plain", *sets, f"logging.out_dir={out / 'runs'}", f"logging.name={name}"]:
            cmd += ["--set", s]
        print(f"[{i}/{len(todo)}] {name}", flush=True)
        p = subprocess.run(cmd, env=os.environ.copy())
        if p.returncode != 0:
            print(f"adloco: error: bench: variant {name} failed (exit code {p.returncode})", file=sys.stderr)
            return p.returncode
        run_dirs.append(sorted((out / "runs").glob(f"{name}-*"))[-1])
    runs = [compare.load(d) for d in run_dirs]
    report = compare.write(runs, out, settings["target"], command="adloco " + shlex.join(argv))
    (out / "resolved.yaml").write_text(dump_yaml(shared), encoding="utf-8")
    print(f"report: {report}")
    return 0
