"""Keras for HorovodRunner jobs, on Keras 2 and Keras 3: :func:`fit` and the callbacks.

Modules, imported one way (each only from those above it):

- ``compat``: which Keras ``tf.keras`` is; the rank-process import guard.
- ``optimizer``: gradient averaging over ranks for any Keras optimizer.
- ``callbacks``: broadcast, metric averaging, LR warmup/schedule, MLflow, log, sync check.
- ``checkpoint``: verified rank-0 checkpoints with fallback to the newest intact one.
- ``fit``: the whole integration in one call.

TensorFlow is imported on first use only, so ``import hvdrunner`` stays light on the driver.

Example:
    >>> from hvdrunner.keras import fit, LogCallback  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from hvdrunner.keras import callbacks
from hvdrunner.keras.callbacks import RanksOutOfSyncError, average_metrics
from hvdrunner.keras.checkpoint import CheckpointError
from hvdrunner.keras.fit import FitConfig, FitResult, fit
from hvdrunner.keras.models import log_model

__all__ = [
    "CheckpointError",
    "FitConfig",
    "FitResult",
    "LogCallback",
    "MLflowCallback",
    "RanksOutOfSyncError",
    "average_metrics",
    "callbacks",
    "fit",
    "log_model",
]


def __getattr__(name: str) -> Any:
    # The callback classes subclass this process's Keras Callback: built on first access.
    if name in ("LogCallback", "MLflowCallback"):
        return getattr(callbacks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
