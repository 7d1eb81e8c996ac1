"""Make this venv's horovod look like one hvdrunner did not build, for one block.

The marker module is renamed in place (the executors and the network-namespace hosts share
this venv, so nothing less reaches them); a test killed inside the block would leave it so,
which is why every test session starts with :func:`restore_hidden` (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path

from hvdrunner.multihost import MARKER_MODULE

SUFFIX = ".hidden-by-test"


def restore_hidden() -> list[Path]:
    """Put back a marker a killed test left hidden; returns what was restored."""
    import horovod

    restored = []
    for away in Path(horovod.__file__).parent.rglob(f"*{SUFFIX}"):
        away.rename(away.with_suffix(".py"))
        restored.append(away)
    return restored


@contextlib.contextmanager
def marker_hidden() -> Iterator[None]:
    """Move the gloo patch's marker module away (processes sharing the venv, executors
    included, then see an unpatched horovod), and put it back whatever happens."""
    spec = importlib.util.find_spec(MARKER_MODULE)
    assert spec is not None and spec.origin, "this horovod lacks the patch's marker"
    marker = Path(spec.origin)
    away = marker.with_suffix(SUFFIX)
    marker.rename(away)
    try:
        yield
    finally:
        away.rename(marker)
