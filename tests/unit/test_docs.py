"""The documentation against the code.

* docs/ALGORITHM.md's headings are numbered strictly (``## 2. Title``, ``### 2.5 Title``), and every
  section reference in the repository (``ALGORITHM.md`` then the section sign and a number, a range such
  as 2.1–2.4 allowed) names a section that exists; in Markdown the reference is a link to its heading.
* The site's reference pages are generated from the code when it is built (docs/hooks.py): the config
  keys from ``adloco.config.field_docs()``, the events and summary keys from ``adloco.events``, the
  command line from the parser, the API from ``adloco.__all__``. These tests call the generators: every
  event, key, section and command is there, agrees with ``adloco config`` and with what a tiny real run
  writes. The tables still written by hand (the run directory's files, the config sections) are checked
  against the code and the run.
* What ``--resume`` may change is said once (``RESUMABLE_TEXT``): ``adloco train --help`` and the
  guide to runs that survive failures carry it verbatim.

Links, navigation and captions of the site: tests/unit/test_site.py. This file writes the section sign
as an escape, so that its own text holds no reference to check.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
from pathlib import Path

import pytest

from adloco import config, events
from adloco.cli import build_parser
from adloco.engine import rundir
from adloco.telemetry.metrics import tensorboard_available
from tests.helpers import train_once
from tests.unit.docs_site import docs_hooks

ROOT = Path(__file__).resolve().parents[2]
ALGORITHM = ROOT / "docs" / "ALGORITHM.md"
README = ROOT / "README.md"
RUN_DIRECTORY = ROOT / "docs" / "reference" / "run-directory.md"
CONFIG_PAGE = ROOT / "docs" / "reference" / "config.md"
RESUME_PAGE = ROOT / "docs" / "guides" / "fault-tolerance.md"
hooks = docs_hooks()
SIGN = "\u00a7"

# Where references may appear: every tracked kind of text file of the repository.
SCANNED = (
    "*.md",
    "docs/**/*.md",
    "docs/**/*.py",
    "mkdocs.yml",
    "benchmarks/**/*.md",
    "benchmarks/**/*.py",
    "src/**/*.py",
    "configs/**/*.yaml",
    "examples/**/*.py",
    "tests/**/*.py",
    "Makefile",
    "pyproject.toml",
)

NUMBER = r"(\d+(?:\.\d+)?)"
# A section number, or a range of them: 2.5, 2.1–2.4, 3–4 (en dash or hyphen).
NUMBERS = NUMBER + r"(?:\s*[–-]\s*" + NUMBER + r")?"
REFERENCE = re.compile(r"ALGORITHM\.md\s+" + SIGN + NUMBERS)
BARE = re.compile(SIGN + NUMBERS)  # inside ALGORITHM.md itself
LINKED = re.compile(r"\[ALGORITHM\.md\s+" + SIGN + NUMBERS + r"\]\(([^)#\s]+)#([^)\s]+)\)")

H2 = re.compile(r"## (\d+)\. (\S.*)")
H3 = re.compile(r"### (\d+)\.(\d+) (\S.*)")


# -- docs/ALGORITHM.md: its sections ----------------------------------------------------------------


class HeadingError(ValueError):
    pass


def sections(text: str) -> dict[str, tuple[str, int]]:
    """{"2": (heading text, line), "2.5": (...), ...} of an ALGORITHM.md text, or HeadingError.

    The format: one ``# Title`` on the first line; every other heading is ``## N. Title`` with N = 0, 1,
    2, ... in order, or ``### N.k Title`` inside section N with k = 1, 2, ... in order; nothing deeper.
    Lines inside fenced code blocks are not headings.
    """
    out: dict[str, tuple[str, int]] = {}
    first = text.splitlines()[0] if text else ""
    if not re.fullmatch(r"# \S.*", first):
        raise HeadingError(f"line 1: {first!r}: the first line must be the title, '# Title'")
    fenced = False
    major = -1
    minor = 0
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or not line.startswith("#"):
            continue
        where = f"line {i}: {line!r}"
        if i == 1:
            continue
        if line.startswith("# "):
            raise HeadingError(f"{where}: only the first line is a '# ' title")
        if line.startswith("## "):
            m = H2.fullmatch(line.rstrip())
            if m is None:
                raise HeadingError(f"{where}: a section heading must read '## N. Title'")
            if int(m.group(1)) != major + 1:
                raise HeadingError(
                    f"{where}: section {m.group(1)} follows section {major}; expected {major + 1}"
                )
            major, minor = int(m.group(1)), 0
            out[m.group(1)] = (line[3:].strip(), i)
            continue
        if line.startswith("### "):
            m = H3.fullmatch(line.rstrip())
            if m is None:
                raise HeadingError(f"{where}: a subsection heading must read '### N.k Title'")
            if int(m.group(1)) != major:
                raise HeadingError(f"{where}: subsection {m.group(1)}.{m.group(2)} inside section {major}")
            if int(m.group(2)) != minor + 1:
                raise HeadingError(
                    f"{where}: subsection {m.group(1)}.{m.group(2)}; expected {major}.{minor + 1}"
                )
            minor = int(m.group(2))
            out[f"{m.group(1)}.{m.group(2)}"] = (line[4:].strip(), i)
            continue
        raise HeadingError(f"{where}: headings go two levels deep ('## N.' and '### N.k')")
    if fenced:
        raise HeadingError("a fenced code block is not closed")
    return out


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_algorithm_md_is_numbered_like_the_spec() -> None:
    got = sections(ALGORITHM.read_text(encoding="utf-8"))
    assert [k for k in got if "." not in k][:10] == [str(i) for i in range(10)]  # and any added after 9
    subsections = {k for k in got if "." in k}
    assert {"2.1", "2.2", "2.3", "2.4", "2.5", "9.1", "9.2", "9.3", "9.4"} <= subsections


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("# T\n## Vocabulary\n", "'## N. Title'"),
        ("# T\n## 0 Vocabulary\n", "'## N. Title'"),
        ("# T\n## 0.Vocabulary\n", "'## N. Title'"),
        ("# T\n## 1. One\n", "expected 0"),
        ("# T\n## 0. Zero\n## 2. Two\n", "expected 1"),
        ("# T\n## 0. Zero\n### 0.1. One\n", "'### N.k Title'"),
        ("# T\n## 0. Zero\n### 1.1 One\n", "inside section 0"),
        ("# T\n## 0. Zero\n### 0.2 Two\n", "expected 0.1"),
        ("# T\n## 0. Zero\n#### Deeper\n", "two levels deep"),
        ("# T\n# Another title\n", "only the first line"),
        ("Title\n## 0. Zero\n", "the first line must be the title"),
        ("#T\n## 0. Zero\n", "the first line must be the title"),
        ("# T\n```\n", "not closed"),
    ],
)
def test_heading_format_is_strict(text: str, complaint: str) -> None:
    with pytest.raises(HeadingError, match=re.escape(complaint)):
        sections(text)


def test_headings_inside_code_blocks_and_anchors() -> None:
    text = "# T\n## 0. Zero\n```\n## not a heading\n```\n### 0.1 The reference's `formula`\n"
    got = sections(text)
    assert got == {"0": ("0. Zero", 2), "0.1": ("0.1 The reference's `formula`", 6)}
    assert slug(got["0.1"][0]) == "01-the-references-formula"
    assert (
        slug("8. Theory (reconstructed, constants unverified)")
        == "8-theory-reconstructed-constants-unverified"
    )


def test_the_site_links_sections_as_github_does() -> None:
    """The site's anchors (pymdownx.slugs, docs/hooks.py) are GitHub's: one link works in both."""
    assert hooks.slug("0.1 The reference's `formula`") == slug("0.1 The reference's `formula`")
    known = sections(ALGORITHM.read_text(encoding="utf-8"))
    assert hooks.algorithm_anchors() == {k: slug(h) for k, (h, _) in known.items()}
    unknown: list[str] = []
    text = f"ALGORITHM.md {SIGN}2.5, ALGORITHM.md {SIGN}99 and [ALGORITHM.md {SIGN}3](x.md#3)"
    linked = hooks.link_sections(text, "../ALGORITHM.md", unknown)
    assert linked.startswith(f"[ALGORITHM.md {SIGN}2.5](../ALGORITHM.md#{slug(known['2.5'][0])}), ")
    assert unknown == [f"ALGORITHM.md {SIGN}99"] and linked.endswith(f"[ALGORITHM.md {SIGN}3](x.md#3)")


# -- references to sections, everywhere --------------------------------------------------------------


GENERATED = (ROOT / "benchmarks" / "out", ROOT / "build")  # bench outputs and builds: not the project's text


def scanned_files() -> list[Path]:
    found: set[Path] = set()
    for pattern in SCANNED:
        found.update(
            p
            for p in ROOT.glob(pattern)
            if p.is_file() and ".venv" not in p.parts and not any(p.is_relative_to(g) for g in GENERATED)
        )
    return sorted(found)


def dangling(path: Path, text: str, known: dict[str, tuple[str, int]]) -> list[str]:
    """Every problem with the section references of one file, as 'file:line: ...'."""
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    own = path == ALGORITHM
    pattern = BARE if own else REFERENCE
    problems: list[str] = []
    covered: set[int] = set()
    for m in pattern.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        covered.add(m.start() + m.group(0).index(SIGN))
        for number in (m.group(1), m.group(2)):
            if number is not None and number not in known:
                problems.append(f"{rel}:{line}: {m.group(0)!r}: docs/ALGORITHM.md has no section {number}")
    for i, ch in enumerate(text):
        if ch == SIGN and i not in covered:
            line = text.count("\n", 0, i) + 1
            snippet = text[max(0, i - 20) : i + 10].replace("\n", " ")
            problems.append(
                f"{rel}:{line}: {snippet!r}: a section sign that is not a reference to a section of "
                "ALGORITHM.md (write 'ALGORITHM.md' and the section number)"
            )
    if path.suffix == ".md" and not own:
        links = {m.start(): m for m in LINKED.finditer(text)}
        for m in REFERENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            link = links.get(m.start() - 1)
            if link is None:
                problems.append(
                    f"{rel}:{line}: {m.group(0)!r}: not a link to its section ([...](...#anchor))"
                )
                continue
            target, anchor = link.group(3), link.group(4)
            if (path.parent / target).resolve() != ALGORITHM.resolve():
                problems.append(f"{rel}:{line}: {link.group(0)!r}: {target} is not docs/ALGORITHM.md")
            number = link.group(1)
            if number in known and anchor != slug(known[number][0]):
                problems.append(
                    f"{rel}:{line}: {link.group(0)!r}: the anchor of section {number} is "
                    f"#{slug(known[number][0])}, not #{anchor}"
                )
    return problems


def test_every_section_reference_resolves() -> None:
    known = sections(ALGORITHM.read_text(encoding="utf-8"))
    files = scanned_files()
    assert (
        ALGORITHM in files and README in files and ROOT / "src" / "adloco" / "config" / "__init__.py" in files
    )
    problems = [p for f in files for p in dangling(f, f.read_text(encoding="utf-8"), known)]
    assert not problems, "dangling section references:\n" + "\n".join(problems)


def test_the_reference_check_finds_dangling_ones(tmp_path: Path) -> None:
    known = {"2": ("2. B", 3), "2.5": ("2.5 Est", 9), "3": ("3. Merging", 20)}
    code = tmp_path / "x.py"
    text = (
        f'"""ALGORITHM.md {SIGN}2.5 and ALGORITHM.md {SIGN}2.1–2.5 and ALGORITHM.md {SIGN}2–3.\n\n'
        f'spec {SIGN}4, ALGORITHM.md {SIGN}7"""\n'
    )
    problems = dangling(code, text, known)
    assert len(problems) == 3, problems
    assert problems[0].endswith("docs/ALGORITHM.md has no section 2.1") and ":1:" in problems[0]
    assert problems[1].endswith("docs/ALGORITHM.md has no section 7") and ":3:" in problems[1]
    assert "not a reference" in problems[2] and ":3:" in problems[2]
    # Markdown: a reference is a link to its heading's anchor, by a path relative to the page
    page, readme = ROOT / "docs" / "page.md", ROOT / "page.md"  # (the texts are passed, not read)
    assert dangling(page, f"[ALGORITHM.md {SIGN}2.5](ALGORITHM.md#25-est)", known) == []
    assert dangling(readme, f"([ALGORITHM.md {SIGN}2–3](docs/ALGORITHM.md#2-b))", known) == []
    (p,) = dangling(readme, f"[ALGORITHM.md {SIGN}2.5](ALGORITHM.md#25-est)", known)
    assert p.endswith("ALGORITHM.md is not docs/ALGORITHM.md")
    (p,) = dangling(readme, f"see\nALGORITHM.md {SIGN}3 there", known)
    assert p.startswith("page.md:2: ") and "not a link" in p
    (p,) = dangling(readme, f"[ALGORITHM.md {SIGN}3](docs/ALGORITHM.md#3-merge)", known)
    assert p.endswith("the anchor of section 3 is #3-merging, not #3-merge")


def test_config_docs_cite_algorithm_md() -> None:
    """`adloco config` prints these docs: they point at ALGORITHM.md, never at an unpublished spec."""
    known = sections(ALGORITHM.read_text(encoding="utf-8"))
    cited = 0
    for section, key, _, doc in config.field_docs():
        assert "spec " + SIGN not in doc, f"{section}.{key}"
        for m in BARE.finditer(doc):
            assert doc[: m.start()].endswith("ALGORITHM.md "), f"{section}.{key}: {doc!r}"
            assert m.group(1) in known and (m.group(2) is None or m.group(2) in known), f"{section}.{key}"
            cited += 1
    assert cited >= 15


# -- the reference pages against the code -------------------------------------------------------------


def tables(text: str) -> dict[tuple[str, ...], list[list[str]]]:
    """Every Markdown table of a text, keyed by its header cells; a repeated header is an error."""
    out: dict[tuple[str, ...], list[list[str]]] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if (
            lines[i].startswith("|")
            and i + 1 < len(lines)
            and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1])
        ):
            header = tuple(_cells(lines[i]))
            assert header not in out, f"two tables with the header {header}"
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out[header] = rows
        else:
            i += 1
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def names(cell: str) -> list[str]:
    """The code names a cell lists: its backticked words, outside any parentheses."""
    previous = None
    while previous != cell:
        previous, cell = cell, re.sub(r"\([^()]*\)", "", cell)
    return re.findall(r"`([^`]+)`", cell)


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    """Every generated part of the site, as the build makes it."""
    return {name: make() for name, make in hooks.GENERATORS.items()}


def _by_heading(text: str, level: str) -> dict[str, str]:
    """The text under each heading ``<level> `name``` of a generated page, by name."""
    pattern = rf"^{level} `([^`]+)`$"
    headings = re.findall(pattern, text, flags=re.M)
    bodies = re.split(pattern, text, flags=re.M)[2::2]
    return dict(zip(headings, bodies, strict=True))


def test_every_event_and_its_keys_are_documented(generated: dict[str, str]) -> None:
    text = generated["events"]
    by_event = _by_heading(text, "###")
    assert list(by_event) == list(events.EVENTS), "one section per event, in the order a round writes them"
    for name, cls in events.EVENTS.items():
        doc = cls.__doc__ or ""
        assert doc.startswith("Written"), f"{name}: a docstring saying when the event is written"
        assert all(f.metadata.get("doc") for f in dataclasses.fields(cls)), f"{name}: a field without a doc"
        body = by_event[name]
        if cls is events.End:
            assert "summary.json" in body
            continue
        listed = [names(r[0])[0] for r in tables(body)[("key", "type", "what")]]
        assert listed == [f.name for f in dataclasses.fields(cls) if f.name != "round"], name
    common = tables(text.split("### ")[0])[("key", "type", "what")]
    assert [names(r[0])[0] for r in common] == ["event", "round"]


def test_every_summary_key_is_documented(generated: dict[str, str]) -> None:
    listed = [names(r[0])[0] for r in tables(generated["summary"])[("key", "type", "what")]]
    assert listed == [f.name for f in dataclasses.fields(events.Summary)]
    assert all(f.metadata.get("doc") for f in dataclasses.fields(events.Summary))


def test_json_types_read_as_json() -> None:
    assert hooks.json_type(int) == "integer"
    assert hooks.json_type(float | None) == "number or null"
    assert hooks.json_type(dict[int, int]) == "object: id → integer"
    assert hooks.json_type(list[list[int]]) == "array of (array of integer)"
    assert hooks.json_type(dict[int, int] | None) == "(object: id → integer) or null"


def test_every_event_class_is_registered() -> None:
    classes = {
        c
        for c in vars(events).values()
        if isinstance(c, type) and issubclass(c, events.Event) and c is not events.Event
    }
    assert classes == set(events.EVENTS.values())
    assert all(name == cls.event for name, cls in events.EVENTS.items())


def test_config_reference_is_what_adloco_config_prints(generated: dict[str, str]) -> None:
    """One table per section, every key in declaration order, its default as `adloco config` prints it."""
    by_section = _by_heading(generated["config"], "##")
    assert list(by_section) == config.SECTIONS
    printed: dict[tuple[str, str], str] = {}
    section = ""
    for line in config.dump_yaml(config.resolve(None, []), with_docs=True).splitlines():
        if not line.startswith(" "):
            section = line.rstrip(":")
            continue
        key, _, value = line.split(" # ")[0].strip().partition(": ")
        printed[(section, key)] = value
    shown = {}
    for section, body in by_section.items():
        for r in tables(body)[("key", "default", "what")]:
            shown[(section, names(r[0])[0])] = (names(r[1])[0], r[2])
    docs = config.field_docs()
    assert list(shown) == [(s, k) for s, k, _, _ in docs]
    for s, k, _, doc in docs:
        default, what = shown[(s, k)]
        assert default == printed[(s, k)], f"{s}.{k}"
        assert what == hooks.cell(doc), f"{s}.{k}"


def test_config_page_lists_every_config_section() -> None:
    listed = [names(r[0])[0] for r in tables(CONFIG_PAGE.read_text(encoding="utf-8"))[("section", "what")]]
    assert listed == config.SECTIONS  # in the order `adloco config` prints them


def test_dials_are_config_sections() -> None:
    assert hooks.dial_sections() == {
        "Outer": "outer",
        "AdaptiveBatch": "batch",
        "Merging": "merge",
        "Switch": "switch",
        "Wire": "comm",
        "Sync": "sync",
    }


def test_cli_reference_is_every_commands_help(generated: dict[str, str]) -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    by_command = _by_heading(generated["cli"], "##")
    assert list(by_command) == ["adloco", *(f"adloco {c}" for c in sub.choices)]
    assert "--resume RUN_DIR" in by_command["adloco train"]
    assert "--set SECTION.KEY=VALUE" in by_command["adloco config"]


def test_api_reference_covers_every_public_name(generated: dict[str, str]) -> None:
    import adloco

    groups = hooks.api_groups()
    assert "other" not in groups, "a public name in no group of docs/hooks.py API_GROUPS"
    listed = [n for _, group in groups.values() for n in group]
    assert sorted(listed) == sorted(n for n in adloco.__all__ if n != "__version__")
    directives = re.findall(r"^::: (\S+)$", generated["api"], flags=re.M)
    for name in listed:
        obj = getattr(adloco, name)
        assert f"{obj.__module__}.{obj.__qualname__}" in directives, name
    for path in directives:  # each names an object that exists where it says
        module, _, attr = path.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), path


TINY = {
    "model.name": "llama-micro",
    "data.tokenizer": "bpe:300",
    "data.seq_len": "16",
    "data.val_fraction": "0.2",
    "algorithm.rounds": "2",
    "algorithm.inner_steps": "2",
    "merge.every": "1",
    "batch.initial": "2",
    "switch.b_max": "2",
    "eval.max_examples": "4",
    "logging.progress": "off",
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, text_corpus: Path) -> Path:
    """The run directory of one tiny `adloco train` (two rounds, trainers merging every round)."""
    return train_once(tmp_path_factory.mktemp("docs-run"), {**TINY, "data.source": str(text_corpus)})


def test_run_directory_page_is_what_a_run_writes(tiny_run: Path) -> None:
    listed = {names(r[0])[0] for r in tables(RUN_DIRECTORY.read_text(encoding="utf-8"))[("file", "what")]}
    written = {p.name + ("/" if p.is_dir() else "") for p in tiny_run.iterdir()}
    if not tensorboard_available():  # logging.tensorboard: auto writes it only when the package is installed
        listed.discard("tensorboard/")
    listed -= {"wandb/", "mlruns/", "mlflow-run-id"}  # logging.trackers only (tests/unit/test_sinks.py)
    listed.discard("profile.json")  # runtime.profile auto only (tests/unit/test_profile.py)
    listed.discard("trace/")  # logging.trace only (tests/unit/test_gpu_paths.py)
    listed.discard("stopped.json")  # a run stopped by a signal only (tests/unit/test_stop.py)
    assert written == listed
    assert {"config.yaml", "metrics.jsonl", "summary.json", "model/", "plots/", "checkpoints/"} <= listed


def test_a_real_run_writes_only_documented_keys(generated: dict[str, str], tiny_run: Path) -> None:
    event_keys = {
        name: {names(r[0])[0] for r in tables(body).get(("key", "type", "what"), [])} | {"event", "round"}
        for name, body in _by_heading(generated["events"], "###").items()
    }
    summary_keys = {names(r[0])[0] for r in tables(generated["summary"])[("key", "type", "what")]}
    event_keys["end"] = summary_keys | {"event", "round"}
    seen = set()
    for line in (tiny_run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        e = json.loads(line)
        seen.add(e["event"])
        assert set(e) <= event_keys[e["event"]], e["event"]
    assert {"start", "worker", "trainer", "merge", "allocation", "eval", "round", "checkpoint", "end"} <= seen
    assert set(json.loads((tiny_run / "summary.json").read_text(encoding="utf-8"))) <= summary_keys


# -- what --resume may change ------------------------------------------------------------------------


def _train_option(option: str) -> argparse.Action:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    train = sub.choices["train"]
    return next(a for a in train._actions if option in a.option_strings)


def test_resume_help_says_what_may_change() -> None:
    assert rundir.RESUMABLE_TEXT is config.RESUMABLE_TEXT
    help_text = _train_option("--resume").help or ""
    assert config.RESUMABLE_TEXT in help_text
    assert "--config is refused" in help_text


def test_the_guide_says_what_resume_may_change() -> None:
    text = " ".join(RESUME_PAGE.read_text(encoding="utf-8").split())  # line breaks are the page's layout
    assert config.RESUMABLE_TEXT in text
    sentence = text[: text.index(config.RESUMABLE_TEXT)].rsplit("- ", 1)[-1]
    assert "`--config` is refused with `--resume`" in sentence


def test_resumable_names_config_fields() -> None:
    fields = {(s, k) for s, k, _, _ in config.field_docs()}
    for entry in config.RESUMABLE:
        section, _, key = entry.partition(".")
        assert section in config.SECTIONS, entry
        assert key == "" or (section, key) in fields, entry
        assert entry.rstrip(".") in config.RESUMABLE_TEXT or (
            entry.endswith(".") and f" {section}" in config.RESUMABLE_TEXT
        ), entry


def test_the_demos_numbers_and_plots_are_its_runs() -> None:
    """docs/default-run/ holds the run the demo's paragraph and plots come from (`adloco train --set
    runtime.threads=1`: its config.yaml is that command's, so it is re-run when the default changes), and
    getting started says that run's numbers."""
    from adloco.config import dump_yaml, resolve

    run = ROOT / "docs" / "default-run"
    assert (run / "config.yaml").read_text(encoding="utf-8") == dump_yaml(
        resolve(None, ["runtime.threads=1"])
    )
    s = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    evs = [json.loads(x) for x in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert s == {k: v for k, v in evs[-1].items() if k not in ("event", "round")}  # the run's own end
    text = " ".join((ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8").split())
    rounds, kinds = s["rounds"], s["bytes_by_kind"]
    requests = [e["request"] for e in evs if e["event"] == "trainer"]
    merges = [str(e["round"]) for e in evs if e["event"] == "merge"]
    said = [
        f"in one process for {rounds} rounds",
        f"falls from {s['initial_val_ppl']:,.0f} to {s['final_val_ppl']:,.0f} in {rounds} rounds",
        f"requests grow from {requests[0]} to {max(requests)}",
        f"trainers merge 4 → 3 → 2 → 1 at rounds {', '.join(merges[:-1])} and {merges[-1]}",
        f"{s['examples_total']:,} training examples",
        f"{s['communications_total']} communications ({rounds} of them the per-round gather",
        f"{s['bytes_total'] / 1e6:.0f} MB counted on the wire: {kinds['delta'] / 1e6:.0f} MB of Δ, "
        f"{kinds['merge'] / 1e6:.0f} MB of merges, {kinds['move'] / 1e6:.0f} MB of θ sent to moved workers, "
        f"{kinds['stats'] / 1e3:.1f} KB of statistics",
        f"from {s['initial_val_ppl']:,.0f} before training to {s['final_val_ppl']:,.0f} after round {rounds}",
    ]
    for words in said:
        assert words in text, words


RECIPES = [
    "A codec",
    "An outer step",
    "An inner optimizer",
    "A method",
    "An event",
    "A tracker",
    "A launcher",
]


def test_the_contributing_recipes_name_files_that_exist_and_names_that_are_in_them() -> None:
    """docs/contributing.md's recipes for the common changes: every file they name exists, and every name
    in parentheses right after a file is in it, so a recipe that drifts from the tree fails here."""
    text = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    section = text.split("\n## Recipes", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^### (.+)$", section, re.M) == RECIPES
    path = r"[\w./-]+\.(?:py|md|toml|yaml)"
    named = set(re.findall(rf"`({path})`", section))
    assert len(named) >= 25
    assert sorted(p for p in named if not (ROOT / p).is_file()) == []
    flat = " ".join(section.split())  # a parenthesis may run over a line break
    checked = 0
    for file, inside in re.findall(rf"`({path})` \(([^)]*)\)", flat):
        body = (ROOT / file).read_text(encoding="utf-8")
        for name in re.findall(r"`([^`]+)`", inside):
            assert re.search(rf"(?<!\w){re.escape(name)}(?!\w)", body), f"{name} is not in {file}"
            checked += 1
    assert checked >= 30
