"""The collectives behind hvdrunner's Keras callbacks and ``fit`` (Keras 2 and 3).

Every function here is a collective unless it says otherwise: every rank must call it, in
the same order. Horovod (``horovod.tensorflow`` or ``horovod.torch``, by Keras' backend:
:mod:`hvdrunner.keras.backend`) is imported on first call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hvdrunner.core import metrics
from hvdrunner.core.sync import check_fingerprints, weight_fingerprint
from hvdrunner.keras import backend, compat
from hvdrunner.keras.optimizer import variable_key

SYNC_FIX = (
    "Use hvdrunner.keras.fit, or wrap the optimizer with hvdrunner.hvd_keras.DistributedOptimizer "
    "(never horovod.tensorflow.keras under Keras 3), and broadcast initial state with "
    "BroadcastGlobalVariablesCallback(0)."
)


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0) -> None:
    """Overwrite ``variables`` on every rank with ``root_rank``'s values (Keras 2 or 3)."""
    backend.broadcast_variables(variables, root_rank)


def broadcast_model(model: Any, root_rank: int = 0, exclude: set[int] | None = None) -> None:
    """Broadcast the model's weights and its optimizer's state (built first if needed).

    ``exclude``: :func:`~hvdrunner.keras.optimizer.variable_key` of model variables that
    keep each rank's own value (Horovod's ``local_variables``).
    """
    optimizer = getattr(model, "optimizer", None)
    variables = [v for v in model.variables if variable_key(v) not in (exclude or set())]
    if optimizer is not None:
        compat.build_optimizer(optimizer, model.trainable_variables)
        variables += compat.optimizer_variables(optimizer)
    broadcast_variables(variables, root_rank)


def average_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """Average scalar Keras logs over all ranks (a collective: every rank must call it).

    One allreduce for all keys, in sorted order (identical on every rank); the rule is
    :func:`hvdrunner.core.metrics.average`'s. Idempotent, so several averaging callbacks
    are harmless.
    """

    def allreduce(values: np.ndarray) -> np.ndarray:
        return backend.allreduce_array(values, average=True, name="hvdrunner.metric_average")

    return metrics.average(logs, backend.horovod().size(), allreduce)


def check_in_sync(model: Any, rtol: float = 1e-6) -> None:
    """Raise :class:`RanksOutOfSyncError` unless every rank holds rank 0's weights."""
    hvd = backend.horovod()
    if hvd.size() == 1:
        return
    mine = weight_fingerprint(model.get_weights())
    everyone = hvd.allgather_object(mine, name="hvdrunner.weight_sync_check")
    check_fingerprints(everyone, SYNC_FIX, rtol)
