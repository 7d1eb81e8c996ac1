"""Drop-in for ``horovod.tensorflow.keras`` that is correct on Keras 3 and on Keras 2.

Existing Horovod Keras code changes one line::

    import horovod.tensorflow.keras as hvd      # before
    import hvdrunner.hvd_keras as hvd           # after

Everything is built on Horovod's core ops (``grouped_allreduce``, broadcasts,
``broadcast_object``) of the framework under Keras: ``horovod.tensorflow``, or
``horovod.torch`` on Keras 3's PyTorch backend (``KERAS_BACKEND=torch``, no TensorFlow
needed; :mod:`hvdrunner.keras.backend`). Nothing here imports Horovod's own Keras layer,
which trains unsynchronized without an error under Keras 3.

Example:
    >>> import hvdrunner.hvd_keras as hvd  # doctest: +SKIP
    >>> hvd.init()
    >>> opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvd.size()))
    >>> model.compile(optimizer=opt, loss="mse")
    >>> model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    ...                            hvd.callbacks.MetricAverageCallback()])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hvdrunner.keras import backend, callbacks, compat
from hvdrunner.keras.callbacks import broadcast_variables as _broadcast_variables
from hvdrunner.keras.optimizer import distribute

# Horovod's names, from the Horovod of Keras' backend (checked here: JAX, or a backend that
# is not installed, fails at this import with the fix).
_hvd = backend.horovod()
Average, Sum, Compression = _hvd.Average, _hvd.Sum, _hvd.Compression
global_process_set = _hvd.global_process_set
allgather_object, broadcast_object = _hvd.allgather_object, _hvd.broadcast_object
cross_rank, cross_size, local_rank, local_size = (
    _hvd.cross_rank, _hvd.cross_size, _hvd.local_rank, _hvd.local_size
)  # fmt: skip
rank, size, shutdown, is_initialized = _hvd.rank, _hvd.size, _hvd.shutdown, _hvd.is_initialized
gloo_built, gloo_enabled, mpi_built, mpi_enabled, nccl_built = (
    _hvd.gloo_built, _hvd.gloo_enabled, _hvd.mpi_built, _hvd.mpi_enabled, _hvd.nccl_built
)  # fmt: skip

__all__ = [
    "Average",
    "Compression",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "Sum",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "cross_rank",
    "cross_size",
    "elastic",
    "gloo_built",
    "gloo_enabled",
    "global_process_set",
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "nccl_built",
    "rank",
    "shutdown",
    "size",
]


def init(*args: Any, **kwargs: Any) -> None:
    """Horovod's ``init`` (``horovod.tensorflow``'s or ``horovod.torch``'s, by Keras' backend)."""
    compat.check_backend()
    backend.init(*args, **kwargs)


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = global_process_set,
    scale_local_gradients: bool = True,
) -> Any:
    """Make a Keras optimizer average gradients over all ranks (Keras 2 or 3).

    Horovod 0.28.1's signature. The optimizer keeps its class, config and state; the same
    object is returned, with Horovod's ``register_local_var(var)`` (that variable's gradient
    stays this rank's own). ``op`` must be ``Average`` (what data parallelism needs).
    ``backward_passes_per_step=N`` accumulates N batches locally before one exchange; as in
    Horovod, the N local gradients are summed unless ``average_aggregated_gradients=True``.
    ``scale_local_gradients`` (default ``True``, as Horovod) divides the gradients of local
    variables by the number of ranks. What only tunes *how* Horovod reduces - devices,
    ``num_groups``/``groups`` (fusion grouping), ``gradient_predivide_factor`` (where the
    averaging division happens), ``sparse_as_dense`` (sparse gradients are always reduced
    dense here) - gives the same averaged gradients and is accepted as such. Only the global
    process set is supported.

    Example:
        >>> opt = DistributedOptimizer(keras.optimizers.SGD(0.01 * size()))  # doctest: +SKIP
    """
    if process_set is not global_process_set:
        raise ValueError(
            "DistributedOptimizer(process_set=...): only the global process set is supported "
            "here (every rank trains the same model); run one HorovodRunner job per group"
        )
    if not gradient_predivide_factor > 0:
        raise ValueError(
            f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor!r}"
        )
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
        scale_local_gradients=scale_local_gradients,
    )


def PartialDistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: Any,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    groups: Any = None,
    process_set: Any = global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> Any:
    """``horovod.keras.PartialDistributedOptimizer``: :func:`DistributedOptimizer` whose
    ``local_layers`` (a Keras layer or a collection of them) keep their gradients this rank's
    own - every trainable weight of theirs is registered with ``register_local_var``.

    Example:
        >>> opt = PartialDistributedOptimizer(keras.optimizers.Adam(),  # doctest: +SKIP
        ...                                   local_layers=[model.layers[-1]])
    """
    layers = _layers(local_layers)
    opt = DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients,
    )  # fmt: skip
    for layer in layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


def _layers(local_layers: Any) -> list[Any]:
    """``local_layers`` as a list of Keras layers; ValueError as Horovod's for anything else."""
    layer_type = compat.keras_module().layers.Layer
    if local_layers is None:
        return []
    if isinstance(local_layers, layer_type):
        return [local_layers]
    layers = list(local_layers)
    if not all(isinstance(layer, layer_type) for layer in layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    return layers


def broadcast_variables(variables: Sequence[Any], root_rank: int) -> None:
    """Set ``variables`` (Keras 2 or Keras 3 variables) to ``root_rank``'s values everywhere."""
    _broadcast_variables(variables, root_rank)


def allreduce(
    value: Any, name: str | None = None, average: bool | None = None, op: Any = None, **_: Any
) -> Any:
    """Reduce a value (number, array) over ranks; returns a numpy value. Average by default."""
    if op is None:
        op = Sum if average is False else Average
    return backend.allreduce_array(value, name=name, op=op)


def broadcast(value: Any, root_rank: int, name: str | None = None) -> Any:
    """``root_rank``'s value (number, array) on every rank, as numpy."""
    return backend.broadcast_array(value, root_rank, name=name)


def allgather(value: Any, name: str | None = None) -> Any:
    """Every rank's ``value`` (arrays) concatenated along the first axis, as numpy."""
    return backend.allgather_array(value, name=name)


def broadcast_global_variables(root_rank: int) -> None:
    """TF1 graph collections do not exist here (as in Horovod under eager TF 2)."""
    raise RuntimeError(
        "broadcast_global_variables() needs TF1 graph collections, which TF 2 does not have "
        "(Horovod raises too). Use callbacks.BroadcastGlobalVariablesCallback(0) in fit, or "
        "broadcast_variables(model.variables, root_rank=0)."
    )


def load_model(
    filepath: str,
    custom_optimizers: Sequence[type] | None = None,
    custom_objects: dict[str, Any] | None = None,
    compression: Any = Compression.none,
    legacy_opts: bool = False,
) -> Any:
    """Load a saved Keras model; its optimizer (if any) averages gradients, as in Horovod."""
    keras = compat.keras_module()
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        distribute(model.optimizer, compression=compression, sparse_as_dense=False,
                   average_aggregated_gradients=False)  # fmt: skip
    return model


class _Elastic:
    """``hvd.elastic``: :mod:`hvdrunner.keras.elastic` where Keras trains on TensorFlow over
    hvdrunner's engine; elsewhere the attribute access says what to use."""

    def __getattr__(self, name: str) -> Any:
        if not backend.is_torch() and _hvd.__name__.startswith("hvdrunner."):
            import hvdrunner.keras.elastic as keras_elastic  # imports Keras: on first use

            return getattr(keras_elastic, name)
        raise NotImplementedError(
            f"hvd_keras.elastic.{name}: Horovod's elastic Keras API runs on TensorFlow over "
            f"hvdrunner's engine (the default where torch is installed), not on "
            f"{_hvd.__name__}. Unset HVDRUNNER_ENGINE=horovod, or use restarts and "
            f"checkpoints: HorovodRunner(max_restarts=N) starts the job again after a lost "
            f"rank or host, and hvdrunner.keras.fit(checkpoint_dir=...) resumes from the "
            f"newest intact checkpoint."
        )


elastic = _Elastic()
