"""Drop-in for ``horovod.tensorflow.keras`` that is correct on Keras 3 and on Keras 2.

Existing Horovod Keras code changes one line::

    import horovod.tensorflow.keras as hvd      # before
    import hvdrunner.hvd_keras as hvd           # after

Everything is built on ``horovod.tensorflow``'s core ops (``grouped_allreduce``,
``broadcast_variables``, ``broadcast_object``); nothing here imports Horovod's own Keras
layer, which trains unsynchronized without an error under Keras 3.

Example:
    >>> import hvdrunner.hvd_keras as hvd  # doctest: +SKIP
    >>> hvd.init()
    >>> opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(1e-3 * hvd.size()))
    >>> model.compile(optimizer=opt, loss="mse")
    >>> model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    ...                            hvd.callbacks.MetricAverageCallback()])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from horovod.tensorflow import (
    Average,
    Sum,
    allgather_object,
    broadcast_object,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from horovod.tensorflow.compression import Compression

from hvdrunner.keras import callbacks, compat
from hvdrunner.keras.callbacks import broadcast_variables as _broadcast_variables
from hvdrunner.keras.optimizer import distribute

__all__ = [
    "Average",
    "Compression",
    "DistributedOptimizer",
    "Sum",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "rank",
    "shutdown",
    "size",
]

# Horovod arguments that select devices or tune its own fusion: meaningless here, accepted.
_IGNORED = ("device_dense", "device_sparse", "num_groups", "groups", "scale_local_gradients")


def init(*args: Any, **kwargs: Any) -> None:
    """``horovod.tensorflow.init``, after checking Keras can work with Horovod here."""
    import horovod.tensorflow as hvd

    compat.check_backend()
    hvd.init(*args, **kwargs)


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: Any,
    name: str | None = None,
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: Any = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    **kwargs: Any,
) -> Any:
    """Make a Keras optimizer average gradients over all ranks (Keras 2 or 3).

    The optimizer keeps its class, config and state; the same object is returned.
    ``op`` must be ``Average`` (what data parallelism needs). Device and grouping arguments
    of Horovod's version are accepted and ignored. ``backward_passes_per_step=N``
    accumulates N batches locally before one exchange; as in Horovod, the N local
    gradients are summed unless ``average_aggregated_gradients=True``.

    Example:
        >>> opt = DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * size()))  # doctest: +SKIP
    """
    unknown = sorted(set(kwargs) - set(_IGNORED))
    if unknown:
        raise TypeError(f"DistributedOptimizer() got unexpected argument(s): {unknown}")
    if op is not Average:
        raise ValueError(
            "DistributedOptimizer averages gradients (op=hvd.Average); other reductions would "
            "change the effective learning rate. Scale the learning rate instead."
        )
    return distribute(
        optimizer,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
    )


def broadcast_variables(variables: Sequence[Any], root_rank: int) -> None:
    """Set ``variables`` (Keras 2 or Keras 3 variables) to ``root_rank``'s values everywhere."""
    _broadcast_variables(variables, root_rank)


def allreduce(
    value: Any, name: str | None = None, average: bool | None = None, op: Any = None, **_: Any
) -> Any:
    """Reduce a value (number, array) over ranks; returns a numpy value. Average by default."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    if op is None:
        op = Sum if average is False else Average
    return hvd.allreduce(tf.constant(value), op=op, name=name).numpy()


def broadcast(value: Any, root_rank: int, name: str | None = None) -> Any:
    """``root_rank``'s value (number, array) on every rank, as numpy."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    return hvd.broadcast(tf.constant(value), root_rank, name=name).numpy()
