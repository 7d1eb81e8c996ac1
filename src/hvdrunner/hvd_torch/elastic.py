"""``hvd.elastic`` of :mod:`hvdrunner.hvd_torch`: Horovod's elastic names on the engine
(:mod:`hvdrunner.engine.elastic`)."""

from __future__ import annotations

from hvdrunner.engine.elastic import *  # noqa: F403 - the drop-in is exactly these names
from hvdrunner.engine.elastic import __all__ as __all__
