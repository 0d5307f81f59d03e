"""The documentation site, checked without building it (``make docs`` builds it strictly in CI).

* Every page under docs/ is in the navigation of mkdocs.yml, and every entry there is a page.
* Every relative link of the README and of the pages goes to a file of the repository, and, with an
  anchor, to a heading of it (generated headings included); a link from a page to a file outside
  docs/ goes to one the site publishes (docs/hooks.py ``PUBLISHED``).
* Every image of a page has a caption: a ``<figure>`` with a ``<figcaption>``, or an image alone on its
  line, which the build captions with its alt text.
* The README stays short: the two set-up commands first, then what the site does not repeat.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

import pytest
import yaml

from tests.unit.docs_site import ROOT, docs_hooks

hooks = docs_hooks()
DOCS = ROOT / "docs"
README = ROOT / "README.md"


def _mkdocs_yml() -> dict[str, Any]:
    """mkdocs.yml, its ``!!python/...`` tags read as nothing (PyYAML's safe loader refuses them)."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)  # noqa: S506


def _nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in _nav_pages(v)]
    return []


def _pages_on_disk() -> list[str]:
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


def _generated_pages() -> set[str]:
    return {site for site in hooks.PUBLISHED.values() if site.endswith(".md") and "#" not in site}


def test_every_page_is_in_the_navigation() -> None:
    nav = _nav_pages(_mkdocs_yml()["nav"])
    assert len(nav) == len(set(nav)), "a page twice in the navigation"
    assert set(nav) == set(_pages_on_disk()) | _generated_pages()


def test_published_files_exist() -> None:
    for repo in hooks.PUBLISHED:
        assert (ROOT / repo).exists(), repo
    assert {f"benchmarks/plots/{p.name}" for p in (ROOT / "benchmarks/plots").glob("*.png")} <= set(
        hooks.PUBLISHED
    )


# -- links ------------------------------------------------------------------------------------------


def _headings(text: str) -> set[str]:
    """The anchors of a Markdown text's headings (GitHub's, and the site's), outside code blocks."""
    out: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.add(hooks.slug(line.lstrip("#").strip()))
    return out


def _text_of(repo_path: str) -> str:
    """A Markdown file as the site renders it: a page's generated parts included."""
    text = (ROOT / repo_path).read_text(encoding="utf-8")
    if repo_path.startswith("docs/"):
        text = hooks.generate(text, repo_path[len("docs/") :])
    return text


def _links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every inline link and image outside fenced code."""
    out: list[tuple[int, str]] = []
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out += [(i, m.group(2)) for m in hooks.LINK.finditer(line)]
    return out


def _sources() -> list[str]:
    """Every Markdown file of the site, by its path in the repository."""
    pages = [f"docs/{p}" for p in _pages_on_disk()]
    return ["README.md", *pages, *(r for r in hooks.PUBLISHED if r.endswith(".md"))]


@pytest.mark.parametrize("source", _sources())
def test_links_resolve(source: str) -> None:
    text = (ROOT / source).read_text(encoding="utf-8")
    problems = []
    for line, target in _links(text):
        path, _, anchor = target.partition("#")
        if re.match(r"[a-z][a-z0-9+.-]*:", path):
            continue  # a URL
        repo = posixpath.normpath(posixpath.join(posixpath.dirname(source), path)) if path else source
        where = f"{source}:{line}: {target}"
        if not (ROOT / repo).exists():
            problems.append(f"{where}: no such file ({repo})")
            continue
        if source.startswith("docs/") and path and hooks.site_target(target, source) is None:
            problems.append(f"{where}: outside docs/ and not published (docs/hooks.py PUBLISHED)")
        if anchor and repo.endswith(".md") and anchor not in _headings(_text_of(repo)):
            problems.append(f"{where}: {repo} has no heading #{anchor}")
    assert not problems, "\n".join(problems)


def test_links_are_mapped_onto_the_site() -> None:
    assert hooks.site_target("../../benchmarks/RESULTS.md#x", "docs/guides/a.md") == "results/index.md#x"
    assert hooks.site_target("../ALGORITHM.md#7-x", "docs/guides/a.md") == "ALGORITHM.md#7-x"
    assert hooks.site_target("gpu-h100/", "benchmarks/RESULTS.md") == "results/gpu-h100/index.md"
    assert hooks.site_target("docs/guides/library.md", "README.md") == "guides/library.md"
    assert (
        hooks.site_target("examples/hf_trainer.py", "README.md") == "guides/hf-trainer.md#the-whole-example"
    )
    assert hooks.site_target("https://example.org/a.md", "README.md") is None
    assert hooks.site_target("../configs/default.yaml", "docs/a.md") is None  # not published: the build fails
    readme = hooks.rewrite_links("[a](docs/ALGORITHM.md#0-v) [b](benchmarks/RESULTS.md)", "index.md")
    assert readme == "[a](ALGORITHM.md#0-v) [b](results/index.md)"
    results = hooks.rewrite_links("![p](plots/x.png)\n```\n[c](../docs/x.md)\n```\n", "results/index.md")
    assert results == "![p](plots/x.png)\n```\n[c](../docs/x.md)\n```\n"  # code is left alone


# -- images ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["README.md", *(f"docs/{p}" for p in _pages_on_disk())])
def test_every_image_has_a_caption(source: str) -> None:
    text = (ROOT / source).read_text(encoding="utf-8")
    figures = re.findall(r"<figure.*?</figure>", text, flags=re.S)
    for figure in figures:
        assert "<figcaption" in figure, f"{source}: a figure without a caption"
    rest = re.sub(r"<figure.*?</figure>", "", text, flags=re.S)
    for line in rest.splitlines():
        for m in re.finditer(r"!\[([^\]]*)\]\(([^)]+)\)", line):
            alone = hooks.IMAGE_LINE.fullmatch(line.strip()) is not None
            assert alone and m.group(1).strip(), (
                f"{source}: {m.group(0)!r}: an image needs a caption: alone on its line with alt text, "
                "or in a <figure> with a <figcaption>"
            )


def test_a_lone_image_is_captioned_by_its_alt_text() -> None:
    got = hooks.caption_images("text\n![the demo's requests](x.png)\n")
    assert "<figcaption>the demo's requests</figcaption>" in got and got.count("<figure") == 1
    inside = "<figure markdown>\n\n![a](x.png)\n\n<figcaption markdown>\n\nmine\n\n</figcaption>\n</figure>"
    assert hooks.caption_images(inside) == inside


# -- the README -----------------------------------------------------------------------------------------


def test_the_readme_is_short_and_starts_with_the_set_up_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.split()) <= 2000
    lines = text.splitlines()
    assert lines[2] == "```bash" and lines[3].startswith("make train ") and lines[4].startswith("make test ")
    assert lines[5] == "```"
    for heading in ("## Quick start", "## Use it in your own loop", "## Documentation"):
        assert heading in lines, heading


def test_markers_are_known() -> None:
    for page in _pages_on_disk():
        for marker in hooks.MARKER.findall((DOCS / page).read_text(encoding="utf-8")):
            assert marker in hooks.GENERATORS, f"docs/{page}: {marker}"
    with pytest.raises(ValueError, match="unknown marker"):
        hooks.generate("<!-- generated: nothing -->", "x.md")
