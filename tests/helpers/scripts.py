"""The repository's scripts as modules: ``scripts/`` is no package, so the tests import its
files by path. One load per file and test session."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(relative: str) -> ModuleType:
    """``scripts/<relative>.py`` as a module named by its file, registered in ``sys.modules``
    (dataclasses look their module up there); a second call returns the same module.

    Example:
        >>> load("runtime_pins") is load("runtime_pins")
        True
    """
    path = SCRIPTS / f"{relative}.py"
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
