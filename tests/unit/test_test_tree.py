"""The test tree itself: test files share their builders through tests/helpers.py and the modules beside it
(tests/toy.py, tests/toy_lm.py, tests/recorded.py), never by importing one another, so that a change to one
test file reaches no other."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_test_files(path: Path) -> list[str]:
    """The test modules (``test_*``) that the file imports, as written."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [n for n in names if n.split(".")[-1].startswith("test_")]
    return found


def test_no_test_file_imports_another() -> None:
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 50  # the tree was found
    offenders = {str(f.relative_to(TESTS)): got for f in files if (got := imported_test_files(f))}
    assert offenders == {}, "share builders through tests/helpers.py (or toy.py, toy_lm.py, recorded.py)"
