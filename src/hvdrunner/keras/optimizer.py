"""Gradient averaging over ranks for any Keras optimizer, Keras 2 and Keras 3 alike.

Built on ``horovod.tensorflow``'s core op ``grouped_allreduce`` only. The optimizer keeps its
class, config and state: its class is swapped for a subclass of itself whose gradient entry
point (``apply`` on Keras 3, ``apply_gradients`` on Keras 2) averages the gradients over
ranks first. Keras 3 routes ``apply_gradients`` through ``apply``, so each step reduces once.
"""

from __future__ import annotations

from typing import Any

from hvdrunner.keras import compat

_MARK = "_hvdrunner_distributed"


def _compression(name: str | Any) -> Any:
    from horovod.tensorflow.compression import Compression

    if name is None or name == "none":
        return Compression.none
    if name == "fp16":
        return Compression.fp16
    if name in (Compression.none, Compression.fp16):
        return name
    raise ValueError(
        f"compression must be 'none' or 'fp16' (or horovod's Compression.none/fp16), got {name!r}"
    )


def allreduce_gradients(grads: list[Any], compression: Any) -> list[Any]:
    """Average ``grads`` over all ranks in one grouped allreduce (graph- and eager-safe).

    ``None`` gradients (variables the loss does not touch) stay ``None``; sparse gradients
    (``IndexedSlices`` from embeddings) are made dense first.
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    if hvd.size() == 1:
        return list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    dense = []
    for i in present:
        g = grads[i]
        if isinstance(g, tf.IndexedSlices):
            # A grouped allreduce needs dense tensors (Horovod itself would allgather the
            # slices, which costs more for all but the sparsest updates).
            g = tf.convert_to_tensor(g)
        dense.append(g)
    reduced = hvd.grouped_allreduce(dense, op=hvd.Average, compression=compression)
    out = list(grads)
    for i, r in zip(present, reduced, strict=True):
        out[i] = r
    return out


def _subclass(base: type, keras3: bool) -> type:
    if keras3:

        def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
            grads = allreduce_gradients(list(grads), self._hvdrunner_compression)
            return base.apply(self, grads, trainable_variables)  # type: ignore[attr-defined]

        methods: dict[str, Any] = {"apply": apply}
    else:

        def apply_gradients(self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            pairs = list(grads_and_vars)
            grads = allreduce_gradients([g for g, _ in pairs], self._hvdrunner_compression)
            return base.apply_gradients(  # type: ignore[attr-defined]
                self, list(zip(grads, [v for _, v in pairs], strict=True)), *args, **kwargs
            )

        methods = {"apply_gradients": apply_gradients}
    # Same name and module as the base: a saved model (with its optimizer) deserializes as
    # the plain optimizer wherever hvdrunner/horovod are absent.
    methods.update({"__module__": base.__module__, "__qualname__": base.__qualname__, _MARK: True})
    return type(base.__name__, (base,), methods)


def distribute(
    optimizer: Any,
    *,
    compression: str | Any = "none",
    sparse_as_dense: bool = True,
    backward_passes_per_step: int = 1,
) -> Any:
    """Make ``optimizer`` average its gradients over all ranks before applying them.

    Works on Keras 3 and Keras 2 optimizers (``tf.keras``, ``tf_keras``, legacy ones). The
    same object is returned, now a subclass of its own class; calling it twice is harmless.

    Args:
        optimizer: a Keras optimizer instance.
        compression: ``"none"`` or ``"fp16"`` (gradients travel as float16: half the bytes).
        sparse_as_dense: accepted for Horovod compatibility; sparse gradients are always
            averaged as dense tensors here.
        backward_passes_per_step: must be 1 (accepted for Horovod's signature).

    Example:
        >>> opt = distribute(tf.keras.optimizers.Adam(1e-3))  # doctest: +SKIP
    """
    if getattr(type(optimizer), _MARK, False):
        return optimizer
    compat.check_backend()
    keras3 = compat.is_keras3()
    if not hasattr(optimizer, "apply" if keras3 else "apply_gradients"):
        raise TypeError(
            f"DistributedOptimizer needs a Keras optimizer instance (tf.keras.optimizers.*), "
            f"got {type(optimizer).__module__}.{type(optimizer).__qualname__}"
        )
    if backward_passes_per_step != 1:
        raise ValueError(
            f"backward_passes_per_step={backward_passes_per_step!r}: local gradient accumulation "
            f"is not supported by hvdrunner yet; pass 1 (the default) and raise batch_size instead."
        )
    optimizer._hvdrunner_compression = _compression(compression)
    optimizer.__class__ = _subclass(type(optimizer), keras3)
    return optimizer
