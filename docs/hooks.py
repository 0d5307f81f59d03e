"""The documentation site's build hooks (``hooks:`` in mkdocs.yml): what the site generates, and from what.

* **Generated pages.** A page holds a marker, an HTML comment such as ``<!-- generated: config -->``,
  that the build replaces with Markdown made from the code: the config keys from the one schema
  (:func:`adloco.config.field_docs`, what ``adloco config`` prints), the events of ``metrics.jsonl`` and
  the keys of ``summary.json`` from :mod:`adloco.events`, the command line from
  :func:`adloco.cli.build_parser`, and the Python API as mkdocstrings directives for every name of
  ``adloco.__all__``. Nothing generated is committed, so nothing can drift from the code.
* **Files from outside docs/.** The README is the home page and ``benchmarks/RESULTS.md`` the results
  page, read at build time; their images and the other files they link to are published beside them
  (:data:`PUBLISHED`). Every page writes its links as paths in the repository (they work on GitHub); the
  build maps a link to a published file onto its place in the site, and leaves any other link alone, so
  that MkDocs' strict validation fails on it.
* **Captions.** An image alone on its line becomes a figure captioned by its alt text; a page that
  needs more (a link in the caption) writes the ``<figure>`` itself.

The generators are plain functions (no MkDocs import), so the unit tests call them directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
import re
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ALGORITHM = ROOT / "docs" / "ALGORITHM.md"

# Files outside docs/ that the site publishes: path in the repository -> path in the site (a page may
# stand for a file it includes, at an anchor). Markdown pages are rendered; other files are copied.
PUBLISHED: dict[str, str] = {
    "README.md": "index.md",
    "benchmarks/RESULTS.md": "results/index.md",
    "benchmarks/gpu-h100": "results/gpu-h100/index.md",
    "benchmarks/gpu-h100/README.md": "results/gpu-h100/index.md",
    "benchmarks/gpu-h100/gpu.md": "results/gpu-h100/gpu.md",
    "benchmarks/gpu-h100/gpu.json": "results/gpu-h100/gpu.json",
    "benchmarks/gpu-h100-2026-11": "results/gpu-h100-2026-11/index.md",
    "benchmarks/gpu-h100-2026-11/README.md": "results/gpu-h100-2026-11/index.md",
    **{
        f"benchmarks/gpu-h100-2026-11/{p.name}": f"results/gpu-h100-2026-11/{p.name}"
        for p in (ROOT / "benchmarks/gpu-h100-2026-11").glob("*")
        if p.name != "README.md"
    },
    "benchmarks/gpu-h200": "results/gpu-h200/index.md",
    "benchmarks/gpu-h200/README.md": "results/gpu-h200/index.md",
    **{
        f"benchmarks/gpu-h200/{name}": f"results/gpu-h200/{name}"
        for name in (
            "device-check.log",
            "engine-profile-by-device-time.txt",
            "engine-profile-by-host-time.txt",
            "overhead-gpu.json",
            "overhead-gpu.log",
            "pinned-batches.log",
            "profile_engine.py",
            "unit-tier-on-gpu.txt",
        )
    },
    "benchmarks/gpu-h200-2026-11-28": "results/gpu-h200-2026-11-28/index.md",
    "benchmarks/gpu-h200-2026-11-28/README.md": "results/gpu-h200-2026-11-28/index.md",
    **{
        f"benchmarks/gpu-h200-2026-11-28/{p.name}": f"results/gpu-h200-2026-11-28/{p.name}"
        for p in (ROOT / "benchmarks/gpu-h200-2026-11-28").glob("*")
        if p.name != "README.md"
    },
    **{
        f"benchmarks/plots/{p.name}": f"results/plots/{p.name}"
        for p in (ROOT / "benchmarks/plots").glob("*.png")
    },
    # files a page includes whole (pymdownx.snippets): a link to one goes to the page
    "examples/hf_trainer.py": "guides/hf-trainer.md#the-whole-example",
    "examples/lightning_trainer.py": "guides/lightning.md#the-whole-example",
    "examples/diloco_own_loop.py": "guides/library.md#diloco-in-your-loop",
    "examples/adloco_own_loop.py": "guides/library.md#adloco-in-your-loop",
    "examples/_common.py": "guides/library.md#the-examples-shared-helpers",
    "configs/paper-microllama-c4.yaml": "guides/data-and-models.md#the-papers-setting",
}

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")


# -- the section references of ALGORITHM.md ---------------------------------------------------------


def slug(heading: str) -> str:
    """The anchor GitHub (and this site's toc, pymdownx.slugs) gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")


def algorithm_anchors() -> dict[str, str]:
    """{"2.5": "25-where-the-gradient-samples-come-from", ...}: every numbered section of ALGORITHM.md."""
    out: dict[str, str] = {}
    fenced = False
    for line in ALGORITHM.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.fullmatch(r"#{2,3} (\d+(?:\.\d+)?)\.? .*", line.rstrip())
        if m:
            out[m.group(1)] = slug(line.lstrip("#").strip())
    return out


REFERENCE = re.compile(r"(?<!\[)ALGORITHM\.md \u00a7(\d+(?:\.\d+)?)(?:[–-](\d+(?:\.\d+)?))?")


def link_sections(text: str, to_algorithm: str, unknown: list[str] | None = None) -> str:
    """Every ``ALGORITHM.md`` + section sign + number of generated text as a link to its heading
    (``to_algorithm``: the page's path to ALGORITHM.md); a section that does not exist goes to
    ``unknown`` and stays text."""
    anchors = algorithm_anchors()

    def one(m: re.Match[str]) -> str:
        number = m.group(1)
        if number not in anchors:
            if unknown is not None:
                unknown.append(m.group(0))
            return m.group(0)
        return f"[{m.group(0)}]({to_algorithm}#{anchors[number]})"

    return REFERENCE.sub(one, text)


# -- Markdown helpers --------------------------------------------------------------------------------


def cell(text: str) -> str:
    """Text for a table cell: one line, pipes escaped, and outside code a ``<`` that would open a tag."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _docstring(obj: Any) -> str:
    return " ".join((obj.__doc__ or "").split()).replace("``", "`")


# -- the config keys: adloco.config's one schema --------------------------------------------------------


def yaml_value(value: Any) -> str:
    """A default as YAML writes it in a config file (and ``adloco config`` prints it)."""
    import yaml

    text = yaml.safe_dump({"k": value}, default_flow_style=True, sort_keys=False).strip()
    return text[len("{k: ") : -1]


def config_reference() -> str:
    """One table per config section, in the order ``adloco config`` prints them: key, default, doc."""
    from adloco import config

    out: list[str] = []
    by_section: dict[str, list[tuple[str, str, str]]] = {}
    for section, key, default, doc in config.field_docs():
        by_section.setdefault(section, []).append((f"`{key}`", f"`{yaml_value(default)}`", doc))
    dials = {section: dial for dial, section in dial_sections().items()}
    for section in config.SECTIONS:
        out += [f"## `{section}`", ""]
        if section in dials:
            out += [
                f"The library's dial [`{dials[section]}`](api.md#adloco.library.settings.{dials[section]}) takes "
                "these fields" + (" (all but the b_max search's)" if section == "switch" else "") + ".",
                "",
            ]
        out += [table(("key", "default", "what"), by_section[section]), ""]
    return "\n".join(out)


def dial_sections() -> dict[str, str]:
    """The library's dials (``adloco.library.settings``) by class name -> the config section that is the same
    dataclass, or extends it (``switch``: the b_max search of ``adloco train``)."""
    from adloco import config
    from adloco.library import settings

    out: dict[str, str] = {}
    for section, cls in config.SECTION_TYPES.items():
        for base in cls.__mro__:
            if (
                base.__module__ == settings.__name__
                and base.__name__ != "Dial"
                and dataclasses.is_dataclass(base)
            ):
                out.setdefault(base.__name__, section)
                break
    return out


# -- the run directory: adloco.events ---------------------------------------------------------------


def json_type(tp: Any) -> str:
    """A field's type as it reads in the JSON: integer, number, string, boolean, null, array, object."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_grouped(json_type(a)) for a in args)
    if origin is list:
        return f"array of {_grouped(json_type(args[0]))}" if args and args[0] is not Any else "array"
    if origin is dict:
        key = "id" if args[0] is int else "name"
        return f"object: {key} → {_grouped(json_type(args[1]))}"
    names = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
    if tp in names:
        return names[tp]
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def _grouped(text: str) -> str:
    """A compound type inside another, in parentheses: (object: id → integer) or null."""
    return f"({text})" if " " in text else text


def field_rows(cls: type) -> list[tuple[str, str, str]]:
    """(key, JSON type, doc) of every field of an event or the summary; a field without a doc is an
    error."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        doc = f.metadata.get("doc")
        if not doc:
            raise ValueError(f"adloco.events.{cls.__name__}.{f.name}: no metadata['doc']")
        rows.append((f"`{f.name}`", json_type(hints[f.name]), doc))
    return rows


def events_reference() -> str:
    """Every event of metrics.jsonl: when it is written (its class docstring) and its keys."""
    from adloco import events

    (round_row,) = [r for r in field_rows(events.Event) if r[0] == "`round`"]
    out = [
        "Every event has the keys",
        "",
        table(
            ("key", "type", "what"),
            [("`event`", "string", "the event's name, the heading below"), round_row],
        ),
        "",
        "and the keys of its own:",
        "",
    ]
    for name, cls in events.EVENTS.items():
        out += [f"### `{name}`", "", _docstring(cls), ""]
        if cls is events.End:
            out += ["Its keys are those of [`summary.json`](#summaryjson).", ""]
            continue
        out += [table(("key", "type", "what"), [r for r in field_rows(cls) if r[0] != "`round`"]), ""]
    return "\n".join(out)


def summary_reference() -> str:
    """The keys of summary.json (and of the end event)."""
    from adloco import events

    return "\n".join(
        [_docstring(events.Summary), "", table(("key", "type", "what"), field_rows(events.Summary))]
    )


# -- the command line: adloco.cli's parser ------------------------------------------------------------


@contextlib.contextmanager
def _columns(n: int) -> Iterator[None]:
    """argparse wraps help to the terminal's width: a fixed one, so the page does not depend on it."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(n)
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def cli_reference() -> str:
    """``adloco --help`` and every command's ``--help``, as argparse prints them."""
    import argparse

    from adloco.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    out: list[str] = []
    with _columns(100):
        out += ["## `adloco`", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name, command in sub.choices.items():
            out += [f"## `adloco {name}`", "", "```text", command.format_help().rstrip(), "```", ""]
    return "\n".join(out)


# -- the Python API: mkdocstrings directives for adloco.__all__ ----------------------------------------

API_GROUPS: dict[str, tuple[str, list[str]]] = {
    "algorithms": (
        "The algorithm objects: build one from your model(s) and inner optimizer(s), with the round's dials "
        "as keywords or as one `RoundOptions`.",
        ["AdLoCo", "DiLoCo", "LocalSGD", "DDP", "RoundOptions"],
    ),
    "dials": (
        "Small frozen dataclasses, each a config section of `adloco train` with the same fields, defaults "
        "and checks; every field's doc is in the [configuration reference](config.md).",
        ["Outer", "AdaptiveBatch", "Merging", "Switch", "Wire", "Sync"],
    ),
    "outer step": (
        "What the callable of `Outer(optimizer=...)` is given: a trainer's parameters, flat or shaped.",
        ["OuterParams"],
    ),
    "rounds": (
        "What a round plans and what it did.",
        ["WorkerPlan", "RoundReport", "RoundAborted"],
    ),
    "communicators": (
        "How workers talk: in one process, in threads, or over torch.distributed.",
        ["InProcessComm", "ThreadComm", "TorchDistComm", "Hub"],
    ),
    "planning": (
        "A run priced before it is rented (adloco simulate; the planning guide).",
        ["simulate", "Setup", "Simulation"],
    ),
}
EVENTS_API = ["read", "parse", "of", "summary_from_dict"]
# Classes whose page also lists inherited methods (none: AdLoCo is one class, assembled from parts).
INHERITED: set[str] = set()


def api_groups() -> dict[str, tuple[str, list[str]]]:
    """:data:`API_GROUPS`, and any public name it misses (``adloco.__all__`` grows) in ``other``."""
    import adloco

    listed = {n for _, names in API_GROUPS.values() for n in names}
    rest = [n for n in adloco.__all__ if n not in listed and n != "__version__"]
    return {**API_GROUPS, **({"other": ("Further public names.", rest)} if rest else {})}


def api_reference() -> str:
    """A mkdocstrings directive per public name, at the module that defines it."""
    import adloco

    sections = dial_sections()
    out: list[str] = []
    for group, (intro, names) in api_groups().items():
        out += [f"## {group.capitalize()}", "", intro, ""]
        for name in names:
            obj = getattr(adloco, name)  # where it is defined (adloco's names load lazily)
            out += [f"::: {obj.__module__}.{obj.__qualname__}"]
            if name in INHERITED:
                out += ["    options:", "      inherited_members: true"]
            out += [""]
            if name in sections:
                section = sections[name]
                out += [
                    f"The fields: the [`{section}` section](config.md#{section}) of the configuration "
                    "reference.",
                    "",
                ]
    out += [
        "## Reading a run",
        "",
        "The typed events of `metrics.jsonl` ([the run directory](run-directory.md)).",
        "",
    ]
    out += [f"::: adloco.events.{name}\n" for name in EVENTS_API]
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "config": config_reference,
    "events": events_reference,
    "summary": summary_reference,
    "cli": cli_reference,
    "api": api_reference,
}


# -- links and captions --------------------------------------------------------------------------------

LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)((?:\s+\"[^\"]*\")?)\)")
IMAGE_LINE = re.compile(r"!\[([^\]]+)\]\(([^)\s]+)\)")


def source_of(src_uri: str) -> str:
    """Where a page of the site comes from, as a path in the repository."""
    for repo, site in PUBLISHED.items():
        if site == src_uri and not repo.endswith("gpu-h100"):
            return repo
    return f"docs/{src_uri}"


def site_target(target: str, source: str) -> str | None:
    """The path in the site of a link written in ``source`` (a path in the repository), or None where
    the link is not a relative path, or goes to nothing the site has."""
    path, _, anchor = target.partition("#")
    if not path or re.match(r"[a-z][a-z0-9+.-]*:", path) or path.startswith("/"):
        return None
    repo = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    if repo.startswith("docs/"):
        site = repo[len("docs/") :]
    elif repo.rstrip("/") in PUBLISHED:
        site = PUBLISHED[repo.rstrip("/")]
    else:
        return None
    site, _, own = site.partition("#")
    anchor = anchor or own
    return site + (f"#{anchor}" if anchor else "")


def rewrite_links(markdown: str, src_uri: str) -> str:
    """Links of a page written as paths in the repository, as paths in the site (outside code)."""
    source = source_of(src_uri)
    here = posixpath.dirname(src_uri)

    def one(m: re.Match[str]) -> str:
        site = site_target(m.group(2), source)
        if site is None:
            return m.group(0)
        path, _, anchor = site.partition("#")
        rel = posixpath.relpath(path, here or ".")
        return f"{m.group(1)}({rel}{'#' + anchor if anchor else ''}{m.group(3)})"

    return _outside_code(markdown, lambda text: LINK.sub(one, text))


def caption_images(markdown: str) -> str:
    """An image alone on its line (outside a figure) as a figure captioned by its alt text."""
    out: list[str] = []
    figure = False
    for line in markdown.split("\n"):
        figure = (figure or line.lstrip().startswith("<figure")) and "</figure>" not in line
        m = IMAGE_LINE.fullmatch(line.strip())
        if m and not figure:
            out += [
                '<figure markdown="span">',
                f"  {line.strip()}",
                f"  <figcaption>{m.group(1)}</figcaption>",
                "</figure>",
            ]
        else:
            out.append(line)
    return "\n".join(out)


def _outside_code(markdown: str, change: Callable[[str], str]) -> str:
    """``change`` applied to the text outside fenced code blocks."""
    parts = re.split(r"(^```.*?^```[^\n]*$)", markdown, flags=re.M | re.S)
    return "".join(p if i % 2 else change(p) for i, p in enumerate(parts))


def generate(markdown: str, src_uri: str, unknown: list[str] | None = None) -> str:
    """A page's markers replaced by what they stand for (an unknown marker is an error)."""
    to_algorithm = posixpath.relpath("ALGORITHM.md", posixpath.dirname(src_uri) or ".")

    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{src_uri}: unknown marker {m.group(0)!r} (known: {', '.join(GENERATORS)})")
        return _outside_code(GENERATORS[name](), lambda text: link_sections(text, to_algorithm, unknown))

    return MARKER.sub(one, markdown)


# -- the MkDocs events -------------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """The pages and files from outside docs/ (:data:`PUBLISHED`), added to the site's files."""
    from mkdocs.structure.files import File

    for repo, site in PUBLISHED.items():
        path = ROOT / repo
        if "#" in site or path.is_dir():
            continue  # a page that includes the file, or a folder's page
        if not path.is_file():
            raise FileNotFoundError(f"docs/hooks.py PUBLISHED: {repo} does not exist")
        if site.endswith(".md"):
            files.append(File.generated(config, site, content=path.read_text(encoding="utf-8")))
        else:
            files.append(File.generated(config, site, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Markers generated, links mapped onto the site, images captioned; a dangling section reference
    in generated text is a warning (an error under ``--strict``)."""
    import logging

    src_uri = page.file.src_uri
    unknown: list[str] = []
    markdown = generate(markdown, src_uri, unknown)
    for ref in unknown:
        logging.getLogger("mkdocs.hooks").warning(f"{src_uri}: {ref!r}: ALGORITHM.md has no such section")
    return caption_images(rewrite_links(markdown, src_uri))


ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):(?=<code>)")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Docstrings cite names as Sphinx roles (``:class:`x```): the role's name is dropped."""
    return ROLE.sub("", html)
