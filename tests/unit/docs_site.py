"""What the documentation tests share: docs/hooks.py (the site's build hooks) loaded as a module, without
MkDocs, so that the tests call the generators the build calls."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def docs_hooks() -> ModuleType:
    """docs/hooks.py, imported once."""
    spec = importlib.util.spec_from_file_location("adloco_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and typing look a module up by name
    spec.loader.exec_module(module)
    return module
