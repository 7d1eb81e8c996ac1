"""Horovod's ``SyncBatchNormalization`` for ``tf.keras`` (Keras 2 or 3) on the engine: batch
statistics over every rank's batch while training, as if one rank saw them all.

Horovod's arithmetic: each rank's mean and mean of squares (``Var[X] + E[X]^2``) are summed
over the ranks and divided by their number (equal batches weigh the same), and the variance
is ``E[X^2] - E[X]^2``. The allreduce has its gradient, so the backward pass is synchronised
too. Outside training the moving statistics are used, as in Keras.

Example:
    >>> layer = SyncBatchNormalization(momentum=0.9)  # doctest: +SKIP
    >>> model = tf.keras.Sequential([tf.keras.Input((8,)), layer])
"""

from __future__ import annotations

import inspect
from typing import Any

import tensorflow as tf

from hvdrunner.engine import state
from hvdrunner.engine.tf import ops

FUSED = "SyncBatchNormalization does not support fused=True."
_BatchNormalization: type = tf.keras.layers.BatchNormalization


class SyncBatchNormalization(_BatchNormalization):
    """Synchronous batch normalization: statistics over all ranks during training.

    ``fused`` must be ``False`` (Horovod's rule; Keras 3 has no fused kernel to refuse).

    Example:
        >>> norm = SyncBatchNormalization(axis=-1)  # doctest: +SKIP
    """

    def __init__(self, fused: bool | None = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError(FUSED)
        kwargs.setdefault("name", "sync_batch_normalization")
        if "fused" in _init_arguments():
            kwargs["fused"] = fused
        super().__init__(**kwargs)

    def _moments(self, inputs: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Keras' moments (Keras 2: ``inputs, reduction_axes, keep_dims``; Keras 3:
        ``inputs, mask``), then averaged over the ranks."""
        mean, variance = super()._moments(inputs, *args, **kwargs)
        if state.size() == 1:
            return mean, variance
        stacked = tf.stack([mean, variance + tf.math.square(mean)])
        total = ops._allreduce(stacked, op=ops.Sum) / state.size()
        group_mean, group_mean_of_square = tf.unstack(total)
        return group_mean, group_mean_of_square - tf.math.square(group_mean)


def _init_arguments() -> tuple[str, ...]:
    """The arguments Keras' BatchNormalization takes (``fused``: Keras 2's only)."""
    return tuple(inspect.signature(_BatchNormalization).parameters)
