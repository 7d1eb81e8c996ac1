"""Make this venv's horovod look like one hvdrunner did not build, for one block."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path

from hvdrunner.multihost import MARKER_MODULE


@contextlib.contextmanager
def marker_hidden() -> Iterator[None]:
    """Move the gloo patch's marker module away (processes sharing the venv, executors
    included, then see an unpatched horovod), and put it back whatever happens."""
    spec = importlib.util.find_spec(MARKER_MODULE)
    assert spec is not None and spec.origin, "this horovod lacks the patch's marker"
    marker = Path(spec.origin)
    away = marker.with_suffix(".hidden-by-test")
    marker.rename(away)
    try:
        yield
    finally:
        away.rename(marker)
