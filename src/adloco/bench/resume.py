"""``adloco bench --resume``: what a bench goes on with. The run directories of a task (finished,
stopped with a checkpoint) and the config each is compared by (:func:`comparable`), and the refusals of a
command that would not go on as the bench began (:func:`check_resumable`: its config file, the keys
added since, the values this command would resolve otherwise)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from adloco.bench.grid import RESERVED
from adloco.config import Config, dump_yaml, resolve
from adloco.config.load import yaml_value
from adloco.errors import UserError


def run_dirs(runs: Path, name: str) -> list[Path]:
    """The run directories of task ``name`` (``<name>-<timestamp>``), newest first."""
    pattern = re.compile(re.escape(name) + r"-\d{8}-\d{6}(-\d+)?")
    return sorted((d for d in runs.iterdir() if d.is_dir() and pattern.fullmatch(d.name)), reverse=True)


def run_dir(runs: Path, name: str) -> Path | None:
    found = run_dirs(runs, name)
    return found[0] if found else None


def finished_dirs(runs: Path, name: str) -> list[Path]:
    """The run directories of task ``name`` that finished (they have summary.json), newest first."""
    return [d for d in run_dirs(runs, name) if (d / "summary.json").is_file()]


def stopped_dirs(runs: Path, name: str) -> list[Path]:
    """The run directories of task ``name`` that did not finish but hold a config, newest first."""
    return [
        d
        for d in run_dirs(runs, name)
        if not (d / "summary.json").is_file() and (d / "config.yaml").is_file()
    ]


def newest_checkpoint(folder: Path) -> str | None:
    """The name of the run directory's newest complete checkpoint, None when it has none."""
    from adloco.engine.checkpoint import locate

    try:
        return locate(folder)[1].name
    except UserError:
        return None


def comparable(config: dict[str, Any]) -> dict[str, Any]:
    """A run's config without what does not change its results: where it logs, its thread count, and the
    inner keys its inner optimizer does not read (:func:`adloco.engine.describe.inner_as_read`)."""
    from adloco.engine.describe import inner_as_read

    c = {k: v for k, v in config.items() if k != "logging"}
    c["runtime"] = {k: v for k, v in dict(c.get("runtime") or {}).items() if k != "threads"}
    c["inner"] = inner_as_read(dict(c.get("inner") or {}))
    return c


def config_as_resumed(folder: Path) -> dict[str, Any] | None:
    """A run directory's config as ``adloco train --resume`` reads it (keys added since at the values it
    ran with, :data:`adloco.config.load.ADDED`), as :func:`comparable` compares it; None where it does not
    read."""
    try:
        return comparable(yaml.safe_load(dump_yaml(resolve(folder / "config.yaml", resuming=True))))
    except (OSError, yaml.YAMLError, UserError):
        return None


def check_resumable(
    out: Path,
    given: str | None,
    raw: dict[str, Any],
    shared: Config,
    overrides: list[str],
    optimizers: set[str],
    methods: set[str],
) -> None:
    """--resume: ``out`` must be a bench folder made with the same shared settings. Its shared.yaml must be
    this command's config, but for keys added since the bench began (:data:`adloco.config.load.ADDED`)
    written out at the value it ran with (then shared.yaml and resolved.yaml are written again as this
    command's); and a bench made before such a key is refused under a config that would now run it at
    another value (its default changed), in one line naming the key. So is one whose resolved.yaml holds
    any other value this command would run otherwise (a default changed since, or a ``--set`` given then
    and not now, or now with another value): its runs would start over under settings it did not begin
    with. A key the file names now and did not then, where no run can change (:func:`_newly_named`, by the
    presets of the ``methods`` the bench runs), goes on. An inner key none of the bench's
    inner ``optimizers`` reads may differ (a run's config is
    compared without it too)."""
    if given is None:
        raise UserError("--resume: needs --out BENCH_DIR, the bench to go on with")
    if not (out / "shared.yaml").is_file() or not (out / "runs").is_dir():
        raise UserError(
            f"--out {given!r}: not a folder adloco bench made (no shared.yaml and runs/), nothing to resume"
        )
    shared_yaml = yaml.safe_dump(raw, sort_keys=False)
    stored_text = (out / "shared.yaml").read_text(encoding="utf-8")
    ran = ran_with(out)  # the added keys as the bench ran them, where its resolved.yaml says
    now = shared.to_dict()
    for (section, key), was in ran.items():
        if now[section][key] != was and not unread(section, key, optimizers):
            raise UserError(
                f"--resume: {given} ran with {section}.{key}: {yaml_value(was)}, whose default has changed since "
                f"(now {yaml_value(now[section][key])}): add `{key}: {yaml_value(was)}` under `{section}:` to its "
                f"config, or --set {shlex.quote(f'{section}.{key}={yaml_value(was)}')}, to go on as it began"
            )
    if stored_text != shared_yaml:
        stored = yaml.safe_load(stored_text) or {}
        written_out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
        named_now = {o.split("=", 1)[0].strip() for o in overrides}
        for section, key in [*ran, *_newly_named(written_out, stored, out, named_now, methods)]:
            if key in (written_out.get(section) or {}) and key not in (stored.get(section) or {}):
                del written_out[section][key]
                if not written_out[section]:
                    del written_out[section]
        if written_out != stored:
            raise UserError(
                f"--resume: {given}/shared.yaml differs from this command's config (a bench goes on with the "
                "settings it started with: run it with the command that made it, adding --resume)"
            )
    # the same config file: a value resolved otherwise comes from a default or a --set
    check_same_resolution(out, given, yaml.safe_load(dump_yaml(shared)), overrides, optimizers)
    if stored_text == shared_yaml:
        return
    try:  # the same settings, written out: shared.yaml says them as this command does
        (out / "shared.yaml").write_text(shared_yaml, encoding="utf-8")
        (out / "resolved.yaml").write_text(dump_yaml(shared), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--out {given!r}: cannot be written ({exc.strerror})") from None
    print(f"bench: {given}/shared.yaml written again: this command's config, the settings the bench ran with")


# what a bench may go on with at another value: where runs log, and how many threads each uses (a run's
# results do not depend on them; the runner compares runs without them too); the keys the bench sets for
# every run (grid.RESERVED) are not the shared config's to compare either
FREE_ON_RESUME = ("logging.", "runtime.threads")


def _newly_named(
    written_out: dict[str, Any],
    stored: dict[str, Any],
    out: Path,
    overrides: set[str],
    methods: set[str],
) -> list[tuple[str, str]]:
    """The keys the config file names now and did not when the bench began that leave every run as it
    was: each set by this command's ``--set`` too (the file's value reaches no run), or at the value the
    bench resolved it to where no preset of a method the bench runs (``methods``) fills it (a preset fills
    only keys a file leaves unset, so naming one can change a method's runs). What a file gains when a
    default changes and it pins the old value (``inner.optimizer: adamw``); the resolution is then
    compared key by key as ever."""
    from adloco.config import PRESETS

    try:
        resolved = yaml.safe_load((out / "resolved.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        resolved = {}
    presets = [p for m, p in PRESETS.items() if m in methods]
    filled = {(sec, k) for preset in presets for sec, values in preset.items() for k in values}
    found = []
    for section, values in written_out.items():
        if section == "bench" or not isinstance(values, dict):
            continue
        had: dict[str, Any] = stored[section] if isinstance(stored.get(section), dict) else {}
        for key, value in values.items():
            if key in had:
                continue
            was = (resolved.get(section) or {}).get(key, object()) if isinstance(resolved, dict) else object()
            if f"{section}.{key}" in overrides or (was == value and (section, key) not in filled):
                found.append((section, key))
    return found


def check_same_resolution(
    out: Path, given: str, now: dict[str, Any], overrides: list[str], optimizers: set[str]
) -> None:
    """The bench's resolved.yaml against this command's resolution (``now``), key by key, its config file
    being the same (keys resolved.yaml lacks are :data:`adloco.config.load.ADDED`'s business): the first
    key whose value differs is refused in one line, saying how to go on as the bench began."""
    try:
        stored = yaml.safe_load((out / "resolved.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return
    if not isinstance(stored, dict):
        return
    named = {o.split("=", 1)[0].strip() for o in overrides}
    for section, values in now.items():
        was_section = stored.get(section)
        if not isinstance(values, dict) or not isinstance(was_section, dict):
            continue
        for key, value in values.items():
            name = f"{section}.{key}"
            if key not in was_section or name.startswith(FREE_ON_RESUME) or name in RESERVED:
                continue
            if unread(section, key, optimizers):
                continue
            was = was_section[key]
            if was == value:
                continue
            if name in named:
                why = (
                    f"this command sets {yaml_value(value)}: a bench goes on with the settings it began with"
                )
            else:
                why = (
                    f"this command would run {yaml_value(value)} (its default has changed since, or the command "
                    "that began the bench set it)"
                )
            raise UserError(
                f"--resume: {given} ran with {name}: {yaml_value(was)}; {why}: "
                f"--set {shlex.quote(f'{name}={yaml_value(was)}')} goes on as it began"
            )


def unread(section: str, key: str, optimizers: set[str]) -> bool:
    """Whether ``section.key`` is an inner key none of a bench's inner ``optimizers`` reads."""
    from adloco.engine.describe import READ_BY

    return section == "inner" and key in READ_BY and not optimizers & set(READ_BY[key])


def ran_with(out: Path) -> dict[tuple[str, str], Any]:
    """The keys of :data:`adloco.config.load.ADDED` that the bench in ``out`` began before (its
    resolved.yaml lacks them), each with the value it ran with; none where resolved.yaml does not read."""
    from adloco.config.load import ADDED

    try:
        resolved = yaml.safe_load((out / "resolved.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(resolved, dict):
        return {}
    return {
        (section, key): value
        for (section, key), value in ADDED.items()
        if isinstance(resolved.get(section), dict) and key not in resolved[section]
    }
