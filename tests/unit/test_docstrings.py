"""Every public object of the library has a docstring: the site's API page is made from them
(mkdocstrings, docs/reference/api.md), and an object without one would be missing there.

Public: every name of ``adloco.__all__``, and every method and property, not starting with an
underscore, of the classes among them, inherited ones included when an adloco class defines them.
"""

from __future__ import annotations

import inspect
from typing import Any

import adloco


def _documented(obj: Any) -> bool:
    doc = obj.__doc__ if isinstance(obj, property) else inspect.getdoc(obj)
    return bool(doc and doc.strip())


def _own_docstring(cls: type) -> bool:
    """A class's docstring of its own: dataclasses write ``Name(field: type, ...)`` into one that is
    missing."""
    doc = cls.__dict__.get("__doc__")
    return bool(doc and doc.strip()) and not doc.startswith(f"{cls.__name__}(")


def undocumented() -> list[str]:
    """The public objects without a docstring, each once, by where it is defined."""
    missing: set[str] = set()
    for name in adloco.__all__:
        if name == "__version__":
            continue
        obj = getattr(adloco, name)
        if inspect.isclass(obj):
            if not _own_docstring(obj):
                missing.add(f"{obj.__module__}.{obj.__qualname__}")
            for member in dir(obj):
                if member.startswith("_"):
                    continue
                owner = next((c for c in obj.__mro__ if member in vars(c)), None)
                if owner is None or not owner.__module__.startswith("adloco"):
                    continue
                raw = vars(owner)[member]
                if isinstance(raw, (staticmethod, classmethod)):
                    raw = raw.__func__
                if (isinstance(raw, property) or inspect.isfunction(raw)) and not _documented(raw):
                    missing.add(f"{owner.__module__}.{owner.__qualname__}.{member}")
        elif not _documented(obj):
            missing.add(f"{obj.__module__}.{getattr(obj, '__qualname__', name)}")
    return sorted(missing)


def test_every_public_object_has_a_docstring() -> None:
    missing = undocumented()
    assert not missing, "public objects without a docstring:\n" + "\n".join(missing)


def test_the_check_finds_a_missing_docstring(monkeypatch: Any) -> None:
    from adloco.library.settings import Wire

    monkeypatch.setattr(Wire, "__doc__", None)
    assert "adloco.library.settings.Wire" in undocumented()
