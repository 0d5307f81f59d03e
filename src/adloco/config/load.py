"""Reading a config: defaults -> the method's preset -> a YAML file -> ``--set section.key=value``.

A preset only fills what the user did not set, so ``method: diloco`` plus ``batch.test: norm`` is a valid
experiment. YAML and ``--set`` text is read leniently here (``4e-3`` without a dot is a number, ``on`` is
true, ``2.0`` is the integer 2); each section is then built as its dataclass, which checks every field's
type and range (:mod:`adloco.config.schema`); the rules across sections follow
(:mod:`adloco.config.checks`). Every mistake is one :class:`~adloco.errors.UserError` naming the field or
file, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from adloco.config import checks
from adloco.config.schema import BENCH, SECTION_TYPES, SECTIONS, SIMULATE, Config, preset_values
from adloco.errors import UserError
from adloco.library.fields import conform, describe
from adloco.models.sizing import SHAPES


@dataclass(frozen=True)
class RawText:
    """A ``--set`` value: the text as typed and its YAML reading."""

    text: str
    parsed: Any

    def __repr__(self) -> str:
        return repr(self.parsed)


def read_value(value: Any, tp: Any) -> Any:
    """A YAML or ``--set`` value as type ``tp`` (leniently, :func:`adloco.library.fields.conform`), or ValueError.
    A ``--set`` value is its text for a string field (or a choice of strings), else its YAML reading."""
    if isinstance(value, RawText):
        origin = typing.get_origin(tp)
        textual = tp is str or (origin is Literal and all(isinstance(a, str) for a in typing.get_args(tp)))
        # a choice spelled as a YAML boolean (logging.wandb=true) reads as the YAML file would read it
        spelled_bool = (
            origin is Literal and value.text not in typing.get_args(tp) and isinstance(value.parsed, bool)
        )
        value = value.text if textual and not spelled_bool else value.parsed
        if tp == list[str] and (
            value is None or isinstance(value, str)
        ):  # --set logging.trackers=wandb,mlflow
            value = [part.strip() for part in (value or "").split(",") if part.strip()]
    return conform(value, tp, lenient=True)


# logging.wandb and logging.mlflow (auto | on | off) before logging.trackers listed them: an older config,
# or a run directory's config.yaml, keeps what it did (on, or auto with the package installed, lists it)
LEGACY_TRACKERS = ("wandb", "mlflow")


def _legacy_trackers(logging: dict[str, Any]) -> None:
    """Fold the older ``logging.wandb`` / ``logging.mlflow`` keys into ``logging.trackers``, in place."""
    from adloco.telemetry.metrics import available

    old = [k for k in LEGACY_TRACKERS if k in logging]
    if not old:
        return
    listed = list(read_value(logging.pop("trackers", []), list[str])) if "trackers" in logging else []
    for key in old:
        raw = logging.pop(key)
        try:
            mode = read_value(raw, Literal["auto", "on", "off"])
        except ValueError:
            raise UserError(
                f"config: logging.{key} = {raw!r}: must be one of 'auto', 'on', 'off' (or list it in "
                f"logging.trackers, e.g. [{key}])"
            ) from None
        if (mode == "on" or (mode == "auto" and available(key))) and key not in listed:
            listed.append(key)
    logging["trackers"] = listed


# Keys that were renamed or replaced: the line says where they went.
REPLACED = {
    "runtime.worker_speeds": "replaced by runtime.emulate_speed (workers really run slower; simulated time "
    "then prices their measured compute)",
}
# comm's synchronization schedule moved to its own section (comm is what Δ travels as, sync when it travels)
MOVED_TO_SYNC = ("overlap", "fragments", "fragment_delay", "fragment_alpha")
REPLACED.update(
    {
        f"comm.{key}": f"moved to sync.{key} (comm says what Δ travels as, sync when it travels)"
        for key in MOVED_TO_SYNC
    }
)


# Keys added with a default that trains otherwise than runs made before them: a run's config.yaml written
# before a key existed resumes with the value it ran with.
ADDED: dict[tuple[str, str], Any] = {
    ("batch", "noise_rows"): "probed",  # the default became null (requested for the norm test)
    ("inner", "muon_ns_dtype"): "bfloat16",  # torch's Muon before the key; the default became auto
}


def as_it_ran(sections: dict[str, Any]) -> dict[str, Any]:
    """A run's own config (its config.yaml, a checkpoint's), copied: each key of :data:`ADDED` it lacks
    takes the value the run was made with, so a run reads as it ran whatever the defaults have become
    since."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in sections.items()}
    for (section, key), value in ADDED.items():
        if not isinstance(out.get(section), dict):
            out[section] = {}
        out[section].setdefault(key, value)
    return out


def yaml_value(value: Any) -> str:
    """A value as YAML writes it in a line (null, not None; a string unquoted where YAML allows)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _moved_sync_keys(sections: dict[str, dict[str, Any]], every: bool) -> None:
    """The keys ``sync`` took from ``comm``, where a file written before still names them: moved where
    they now live, in place. ``every``: all of them (a run directory's own config.yaml when the run
    resumes, which then runs as it ran); else only those at their default, which ask for nothing (a run's
    config.yaml names every key: it can still be a new run's ``--config``). One set away from its default
    is left, to be refused in one line naming its new key."""
    comm, defaults = sections.get("comm") or {}, SECTION_TYPES["sync"]()
    hints = typing.get_type_hints(type(defaults))
    for key in [k for k in MOVED_TO_SYNC if k in comm]:
        try:
            default = read_value(comm[key], hints[key]) == getattr(defaults, key)
        except ValueError:
            default = False
        if every or default:
            sections.setdefault("sync", {}).setdefault(key, comm.pop(key))


def unknown(kind: str, name: str, known: list[str]) -> UserError:
    """An unknown section or key (``section.key``), with the closest known one spelled as it is written:
    a key as ``section.key``, or a key of another section when this one has none like it."""
    if name in REPLACED:
        return UserError(f"config: {name}: {REPLACED[name]}")
    section, dot, key = name.rpartition(".")
    close = difflib.get_close_matches(key, known, n=1)
    if dot and close:
        suggestion = f"{section}.{close[0]}"
    elif dot:
        elsewhere = [f"{s}.{key}" for s, cls in SECTION_TYPES.items() if key in {k for k, _, _ in cls.docs()}]
        suggestion = elsewhere[0] if elsewhere else ""
    else:
        suggestion = close[0] if close else ""
    hint = f"; did you mean '{suggestion}'?" if suggestion else ""
    return UserError(f"config: unknown {kind} '{name}'{hint} (allowed: {', '.join(known)})")


def first_key(section: str) -> tuple[str, Any]:
    """A section's first key and its default, for examples in messages."""
    key, default, _ = SECTION_TYPES[section].docs()[0]
    return key, default


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true or false"}.get(
        type(value), type(value).__name__
    )


def _sections(raw: Any, origin: str) -> dict[str, dict[str, Any]]:
    """The sections of a file or mapping: known names, each a mapping of keys (an empty one is none).
    ``bench`` is ``adloco bench``'s own section and ``simulate`` ``adloco simulate``'s: other commands
    accept them and ignore them."""
    if not isinstance(raw, dict):
        raise UserError(
            f"{origin}: the top level must be a mapping of sections ({', '.join(SECTIONS)}), got {_kind(raw)}"
        )
    out: dict[str, dict[str, Any]] = {}
    for section, values in raw.items():
        if section in (BENCH, SIMULATE):
            continue
        if section not in SECTIONS:
            raise unknown("section", str(section), SECTIONS)
        if values is None:
            values = {}
        if not isinstance(values, dict):
            key, default = first_key(section)
            raise UserError(
                f"{origin}: {section} = {values!r}: a section must be a mapping of its keys, "
                f"e.g. '{section}: {{{key}: {default}}}'"
            )
        out[section] = values
    return out


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` -> (section, key, value), the value read as YAML (``3`` is an int)."""
    path, eq, raw = text.partition("=")
    path = path.strip()
    if path in SECTIONS:
        key, default = first_key(path)
        raise UserError(
            f"--set {text!r}: {path!r} is a section; set one of its keys, e.g. --set {path}.{key}={default}"
        )
    if not eq:
        raise UserError(f"--set {text!r}: must look like section.key=value")
    parts = path.split(".")
    if len(parts) != 2 or not all(parts):
        raise UserError(f"--set {text!r}: the key must be section.key, e.g. batch.eta=0.5")
    if parts[0] == SIMULATE:
        raise UserError(f"--set {text!r}: the simulate section is read by `adloco simulate` only")
    if parts[0] == BENCH:
        raise UserError(
            f"--set {text!r}: the bench section is read by `adloco bench` only, from its config file "
            "(or its --budget and --target options)"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts[0], parts[1], RawText(raw.strip(), value)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's mapping of sections, as written (checked by :func:`resolve`)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file {str(p)!r}: " + ("a folder, not a file" if p.is_dir() else "not found"))
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise UserError(f"config file {str(p)!r}: malformed YAML{where}: {problem}") from None
    except UnicodeDecodeError:
        raise UserError(f"config file {str(p)!r}: not UTF-8 text") from None
    except OSError as exc:
        raise UserError(f"config file {str(p)!r}: cannot be read ({exc.strerror})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UserError(
            f"config file {str(p)!r}: the top level must be a mapping of sections ({', '.join(SECTIONS)}), "
            f"got {_kind(raw)}"
        )
    return raw


def read_keys(section: str, cls: type, items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """``section``'s keys (the fields of the dataclass ``cls``), each read as its field's type: an unknown
    key or an unreadable value is one line naming ``section.key``. Every section of a config file is read so,
    ``adloco simulate``'s own included."""
    hints = typing.get_type_hints(cls)
    keys = [f.name for f in dataclasses.fields(cls)]
    out = {}
    for key, value in items:
        if key not in keys:
            raise unknown("key", f"{section}.{key}", keys)
        try:
            out[key] = read_value(value, hints[key])
        except ValueError:
            raise UserError(f"config: {section}.{key} = {value!r}: must be {describe(hints[key])}") from None
    return out


def _read_section(section: str, values: dict[str, Any]) -> dict[str, Any]:
    return read_keys(section, SECTION_TYPES[section], values.items())


def build(values: dict[str, dict[str, Any]]) -> Config:
    """The Config of already-read values: each section built (and so checked) as its dataclass."""
    sections = {}
    for name in SECTIONS:  # in declaration order: the first bad field is the one reported
        try:
            sections[name] = SECTION_TYPES[name](**values.get(name, {}))
        except ValueError as exc:
            raise UserError(f"config: {exc}") from None
    return Config(**sections)  # type: ignore[arg-type]


def resolve(
    file: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
    resuming: bool = False,
    planning: bool = False,
) -> Config:
    """Build the resolved config: defaults -> method preset -> ``base``/file -> overrides.

    ``resuming``: the config of a run that continues (its trainers may now outnumber its workers: they
    merge, ALGORITHM.md §9.2). ``planning``: a run ``adloco simulate`` prices and does not run, checked
    without this machine (:func:`adloco.config.checks.check_plan`).

    With a checkpoint as ``model.name`` and ``data.tokenizer`` unset, the tokenizer is the checkpoint's.
    """
    user: dict[str, dict[str, Any]] = {}
    for raw, origin in (
        (base, "config"),
        (load_yaml(file) if file is not None else None, f"config file {str(file)!r}"),
    ):
        if raw is not None:
            sections = _sections(raw, origin)
            _moved_sync_keys(sections, every=resuming and raw is not base)
            if resuming and raw is not base:
                sections = as_it_ran(sections)
            for section, keys in sections.items():
                user.setdefault(section, {}).update(keys)
    for text in overrides or []:
        section, key, value = parse_override(text)
        if section not in SECTIONS:
            raise unknown("section", section, SECTIONS)
        user.setdefault(section, {})[key] = value

    if "logging" in user:
        _legacy_trackers(user["logging"])
    given = {s: _read_section(s, v) for s, v in user.items()}
    # The method decides the preset (read like any other key).
    method = given.get("algorithm", {}).get("method", "adloco")
    # the preset's outer step gives way to the codec's (topk: SparseLoCo's), unless the user chose the step:
    # a momentum they set is never dropped
    chosen = {"optimizer", "momentum"} & set(given.get("outer", {}))
    dtype = "float32" if chosen else given.get("comm", {}).get("dtype", "float32")
    values: dict[str, dict[str, Any]] = {}
    for section in SECTIONS:
        values[section] = {**preset_values(method, section, dtype), **given.get(section, {})}
    model = values["model"].get("name", SECTION_TYPES["model"]().name)  # type: ignore[attr-defined]
    if "tokenizer" not in given.get("data", {}) and model not in SHAPES:
        values["data"]["tokenizer"] = model  # a checkpoint: its own tokenizer, not one trained anew
    cfg = build(values)
    _ignored_outer(cfg, given.get("outer", {}))
    if planning:
        checks.check_plan(cfg)
    else:
        checks.check(cfg, resuming)
    return cfg


def _ignored_outer(cfg: Config, given: dict[str, Any]) -> None:
    """An outer key the user set away from its default that the outer step in effect does not read is
    refused, never dropped: ``outer.momentum`` is Nesterov's alone, ``outer.lr`` is not averaging's (lr 1)
    nor a factory's (``module:function``, which sets its own).
    (A run's own config.yaml names every key, at the defaults where nothing was set: those pass.)"""
    step, default = cfg.outer.optimizer, type(cfg.outer)()
    given = {k: v for k, v in given.items() if v != getattr(default, k, v)}
    if given.get("momentum", 0) and step != "nesterov":  # a momentum of 0 asks for none: honoured
        raise UserError(
            f"config: outer.momentum = {given['momentum']!r}: applies to outer.optimizer nesterov only (the "
            f"outer step is {step}); set outer.optimizer=nesterov to use a momentum"
        )
    if "lr" in given and step not in ("sgd", "nesterov"):
        why = "average steps the whole mean, lr 1" if step == "average" else f"{step} sets its own"
        raise UserError(
            f"config: outer.lr = {given['lr']!r}: applies to outer.optimizer sgd and nesterov only ({why}); "
            "set outer.optimizer=sgd to choose an lr"
        )


def field_docs() -> list[tuple[str, str, Any, str]]:
    """(section, key, default, doc) for every field, in declaration order; a choice field's doc begins
    with its allowed values (``(norm | inner_product | ...)``)."""
    return [(s, k, default, doc) for s in SECTIONS for k, default, doc in SECTION_TYPES[s].docs()]


def dump_yaml(cfg: Config, with_docs: bool = False, section: str | None = None) -> str:
    """The resolved config as YAML (one ``section`` of it, if given); with ``with_docs`` every key carries
    its doc as a comment."""
    tree = cfg.to_dict()
    if section is not None:
        if section == BENCH:
            raise UserError(
                "config: bench is `adloco bench`'s own section (budget, target, methods), read from its "
                "config file; see adloco bench --help"
            )
        if section not in tree:
            raise unknown("section", section, SECTIONS)
        tree = {section: tree[section]}
    if not with_docs:
        return yaml.safe_dump(tree, sort_keys=False)
    from adloco.config.reasons import reason

    lines: list[str] = []
    docs = {(s, k): (default, d) for s, k, default, d in field_docs()}
    method = cfg.algorithm.method
    for name, keys in tree.items():
        lines.append(f"{name}:")
        preset = preset_values(method, name)
        for key, value in keys.items():
            rendered = yaml.safe_dump({key: value}, default_flow_style=True, sort_keys=False).strip()
            rendered = rendered[1:-1] if rendered.startswith("{") else rendered
            default, doc = docs[(name, key)]
            lines.append(f"  {rendered:<34} # {doc}")
            if key in preset:  # the method's preset set it: its reason, while the value is the preset's
                why = reason(method, f"{name}.{key}", preset=True) if value == preset[key] else None
            else:
                why = reason(method, f"{name}.{key}", preset=False) if value == default else None
            if why is not None:
                lines.append(f"  {'':<34} #   why this default: {why}")
    return "\n".join(lines) + "\n"
