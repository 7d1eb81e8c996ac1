"""Metric averaging over ranks, without a framework: which values, in which order, once.

Every rank must reduce the same keys in the same order (a collective): the scalar entries
of its logs, sorted by name, in one float64 vector. The adapter passes its framework's
allreduce of that vector.

Example:
    >>> average({"loss": 0.5, "acc": 1.0, "shape": [1, 2]}, size=1, allreduce=None)
    {'acc': 1.0, 'loss': 0.5}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


def average(
    logs: Mapping[str, Any],
    size: int,
    allreduce: Callable[[np.ndarray], np.ndarray] | None,
) -> dict[str, float]:
    """The scalar entries of ``logs`` averaged over ``size`` ranks with ``allreduce`` (which
    averages one float64 vector over all ranks); one call, sorted keys. Idempotent:
    averaging equal values changes nothing."""
    keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
    if not keys or size == 1 or allreduce is None:
        return {k: float(logs[k]) for k in keys}
    averaged = allreduce(np.array([float(logs[k]) for k in keys], dtype=np.float64))
    return dict(zip(keys, (float(v) for v in np.asarray(averaged)), strict=True))
