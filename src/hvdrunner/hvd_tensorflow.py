"""Horovod's TensorFlow API (``horovod.tensorflow`` 0.28.1) with nothing to compile: change
one line.

    import horovod.tensorflow as hvd        # before: needs a horovod built for your TF
    import hvdrunner.hvd_tensorflow as hvd  # after: hvdrunner's engine (torch.distributed)

Every collective of ``horovod.tensorflow`` is here with Horovod's arguments, gradients and
errors, eagerly and inside ``tf.function`` (not under XLA's ``jit_compile=True``); the
implementation is :mod:`hvdrunner.engine.tf`. ``DistributedOptimizer`` takes Keras optimizers
(Keras 2 and 3: :func:`hvdrunner.hvd_keras.DistributedOptimizer`); TensorFlow 1's
``tf.compat.v1.train`` optimizers are refused with the way out. It runs under HorovodRunner,
``horovodrun``-style environments (``HOROVOD_RANK``...) and torch's (``torchrun``).
``elastic`` (:mod:`hvdrunner.engine.tf.elastic`) resumes ``@hvd.elastic.run`` code from its
last commit when HorovodRunner restarts a job; ``SyncBatchNormalization`` is Horovod's layer.

Example:
    >>> import hvdrunner.hvd_tensorflow as hvd
    >>> hvd.init(); hvd.rank(), hvd.size()
    (0, 1)
    >>> hvd.shutdown()
"""

from __future__ import annotations

from typing import Any

from hvdrunner.engine.tf import *  # noqa: F403 - the drop-in is exactly the engine's names
from hvdrunner.engine.tf import __all__ as _engine_names
from hvdrunner.engine.tf import elastic
from hvdrunner.engine.tf.compression import Compression
from hvdrunner.engine.tf.ops import Average

V1_OPTIMIZER = (
    "hvd.DistributedOptimizer({cls}): TensorFlow 1's tf.compat.v1.train optimizers are not "
    "supported by hvdrunner's engine. Use a Keras optimizer (tf.keras.optimizers.*), or "
    "compute gradients with hvd.DistributedGradientTape and apply them yourself."
)


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,  # noqa: N802
                         device_dense: str = "", device_sparse: str = "",
                         compression: Any = Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: int = Average,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: Any = None,
                         scale_local_gradients: bool = True) -> Any:  # fmt: skip
    """A Keras optimizer that averages its gradients over the ranks (Horovod's signature).

    Example:
        >>> opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01))  # doctest: +SKIP
    """
    import tensorflow as tf

    # Imported when used: hvd_keras binds Horovod's names of Keras' backend at import, which a
    # plain TensorFlow user of this module may never configure.
    from hvdrunner import hvd_keras

    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise NotImplementedError(V1_OPTIMIZER.format(cls=type(optimizer).__name__))
    kwargs: dict[str, Any] = {} if process_set is None else {"process_set": process_set}
    return hvd_keras.DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step, op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
        groups=groups, scale_local_gradients=scale_local_gradients, **kwargs)  # fmt: skip


def __getattr__(name: str) -> Any:
    # SyncBatchNormalization subclasses tf.keras' layer: Keras is imported on first use only.
    if name == "SyncBatchNormalization":
        from hvdrunner.engine.tf.sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [*_engine_names, "DistributedOptimizer", "SyncBatchNormalization", "elastic"]  # noqa: F405
