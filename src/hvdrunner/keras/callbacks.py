"""Keras callbacks for Horovod jobs, on Keras 2 and Keras 3 alike.

The classes subclass whichever ``tf.keras.callbacks.Callback`` this process has, so they are
built on first access (``hvdrunner.keras.callbacks.MetricAverageCallback``) and TensorFlow is
imported only then. Each is a real class: subclass it, or check ``isinstance`` against it.

- ``BroadcastGlobalVariablesCallback(root_rank)``: model + optimizer state from ``root_rank``
  to every rank before the first step (or after the first batch for models built lazily).
- ``MetricAverageCallback()``: epoch metrics averaged over ranks (one collective per epoch).
- ``LearningRateWarmupCallback(initial_lr, warmup_epochs)``: ``initial_lr / size`` →
  ``initial_lr`` linearly over the first epochs (Goyal et al.), per batch.
- ``LearningRateScheduleCallback(initial_lr, multiplier, start_epoch, end_epoch)``.
- ``LogCallback()``: rank 0's epoch lines to the driver (sparkdl's callback of that name).
- ``MLflowCallback()``: averaged epoch metrics into the job's MLflow run, by rank 0.
- ``WeightSyncCheckCallback()``: after the first epoch, every rank's weights must equal rank
  0's, or the job fails loudly (the guard against silent data-parallel divergence).
"""

from __future__ import annotations

from typing import Any

from hvdrunner.core.sync import weight_fingerprint
from hvdrunner.errors import RanksOutOfSyncError
from hvdrunner.keras.collectives import (
    SYNC_FIX,
    average_metrics,
    broadcast_model,
    broadcast_variables,
    check_in_sync,
)

#: The callback classes (in :mod:`hvdrunner.keras._callback_classes`, built on first access
#: because their base class comes from TensorFlow).
NAMES = (
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateWarmupCallback",
    "LearningRateScheduleCallback",
    "LogCallback",
    "MLflowCallback",
    "WeightSyncCheckCallback",
)
__all__ = [*NAMES, "SYNC_FIX", "RanksOutOfSyncError", "average_metrics", "broadcast_model",
           "broadcast_variables", "check_in_sync", "weight_fingerprint"]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in NAMES:
        import hvdrunner.keras._callback_classes as classes  # imports TensorFlow: on demand

        return getattr(classes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
