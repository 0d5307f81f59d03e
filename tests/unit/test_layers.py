"""The tree's layers, held: the library (src/adloco/library) imports nothing of the application around it,
and the application reads an algorithm object only through its methods and its read-only view."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "adloco"
# what the library may import of the rest of adloco: the modules every layer reads
READ_BY_ALL = {"adloco.events", "adloco.netmodel", "adloco.errors"}
# what the application calls or reads on an algorithm object: its public methods and properties; anything
# else it needs goes through `algo.view` (adloco.library.view.View), never the parts the round is built of
PUBLIC = {
    "view", "H", "round", "totals", "alive", "members", "requests", "local_workers", "batch_size", "step_rows",
    "step_all", "settle", "state_dict", "load_state_dict", "set_b_max", "b_max", "bad_rounds", "last_report",
    "holding_theta", "gather_parameters", "start_of", "fixed_rows", "__enter__", "__exit__",
}  # fmt: skip


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {f"{node.module}.{a.name}" if node.module == "adloco" else node.module for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m == "adloco" or m.startswith("adloco.")}


def test_the_library_imports_nothing_of_the_application() -> None:
    files = sorted((SRC / "library").rglob("*.py"))
    assert len(files) > 20
    outside = {
        f"{p.relative_to(SRC)}: {m}"
        for p in files
        for m in _imported(p)
        if not m.startswith("adloco.library") and m not in READ_BY_ALL
    }
    assert outside == set()


def test_the_application_reads_an_algorithm_through_its_methods_and_view() -> None:
    """engine/ and integrations/ (what runs a library object for a user) name on it only :data:`PUBLIC`:
    a new need is a property of the view, not a reach into the algorithm's parts."""
    files = sorted([*(SRC / "engine").rglob("*.py"), *(SRC / "integrations").rglob("*.py")])
    used: dict[str, set[str]] = {}
    for p in files:
        text = p.read_text(encoding="utf-8")
        for name in re.findall(r"\balgo\.(\w+)", text):
            used.setdefault(name, set()).add(str(p.relative_to(SRC)))
    used.pop("pop", None)  # `algo` is also the name of a state dict there (algo.pop("trainers"))
    assert "view" in used and len(files) > 15
    assert {k: sorted(v) for k, v in used.items() if k not in PUBLIC} == {}


def test_no_module_is_over_600_lines() -> None:
    """A module past 600 lines holds more than one idea: split it where the ideas part (the method
    presets left the dials this way)."""
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 80
    long = {
        str(p.relative_to(SRC)): n
        for p in files
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert long == {}
